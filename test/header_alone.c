/* mpq.h must compile alone as C11 with -Wall -Wextra -Werror (meson builds
   this file with those flags; a warning fails the build). */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
int main(void) { return mpq_status_str(MPQ_OK)[0] == 'o' ? 0 : 1; }

// mpq.h must compile alone as C++17 with -Wall -Wextra -Werror.
#define MPQ_IMPLEMENTATION
#include "mpq.h"
int main() { return mpq_status_str(MPQ_OK)[0] == 'o' ? 0 : 1; }

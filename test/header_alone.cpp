// mpq.h must compile alone as C++17 with -Wall -Wextra -Werror (meson builds
// this file with those flags), and the README's C++ zero-initialisation
// idiom must not warn there.
#define MPQ_IMPLEMENTATION
#include "mpq.h"
int main()
{
    mpq_bitplane_desc d{};
    mpq_gemv_opts o{};
    return mpq_status_str(MPQ_OK)[0] == 'o' && d.rows == 0 && o.path == MPQ_PATH_AUTO ? 0 : 1;
}

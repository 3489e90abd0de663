/* Section 1: status codes, aligned memory, version. */
#include "common.h"

#include <stdio.h>

Test(basics, every_status_has_a_distinct_name)
{
    const mpq_status all[] = {MPQ_OK,         MPQ_ERR_ARG,   MPQ_ERR_SIZE,        MPQ_ERR_NONFINITE,
                              MPQ_ERR_BITS,   MPQ_ERR_PERM,  MPQ_ERR_RANGE,       MPQ_ERR_FORMAT,
                              MPQ_ERR_ALIGN,  MPQ_ERR_NOMEM, MPQ_ERR_UNSUPPORTED, MPQ_ERR_NODEVICE,
                              MPQ_ERR_DEVICE, MPQ_ERR_IO,    MPQ_ERR_NOTPD,       MPQ_ERR_CANCELLED};
    const int n = sizeof all / sizeof all[0];
    for (int a = 0; a < n; a++) {
        cr_assert(all[a] <= 0, "errors are negative");
        cr_assert(strlen(mpq_status_str(all[a])) >= 2);
        cr_assert_str_neq(mpq_status_str(all[a]), mpq_status_str((mpq_status)-999));
        for (int b = a + 1; b < n; b++) cr_assert_str_neq(mpq_status_str(all[a]), mpq_status_str(all[b]));
    }
    cr_assert_str_eq(mpq_status_str((mpq_status)-999), "unknown status");
}

Test(basics, aligned_alloc_is_64_byte_aligned_and_writable)
{
    for (size_t sz = 1; sz < 5000; sz = sz * 3 + 1) {
        uint8_t *p = mpq_aligned_alloc(sz);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0);
        memset(p, 0xA5, sz); /* ASan checks the whole range is ours */
        mpq_aligned_free(p);
    }
    cr_assert_null(mpq_aligned_alloc(0));
    cr_assert_null(mpq_aligned_alloc(SIZE_MAX - 8));
    mpq_aligned_free(NULL);
}

Test(basics, version_macros_agree)
{
    cr_assert_eq(MPQ_VERSION, MPQ_VERSION_MAJOR * 10000 + MPQ_VERSION_MINOR * 100 + MPQ_VERSION_PATCH);
}

Test(basics, path_names_and_availability)
{
    cr_assert(mpq_path_available(MPQ_PATH_AUTO));
    cr_assert(mpq_path_available(MPQ_PATH_SCALAR));
    cr_assert(!mpq_path_available((mpq_path)99));
    cr_assert_str_eq(mpq_path_name(MPQ_PATH_SCALAR), "scalar");
    cr_assert_str_eq(mpq_path_name((mpq_path)99), "unknown");
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(MPQ_NO_SIMD)
    cr_assert(mpq_path_available(MPQ_PATH_AVX512));
#endif
#if defined(MPQ_NO_SIMD)
    cr_assert(!mpq_path_available(MPQ_PATH_AVX2) && !mpq_path_available(MPQ_PATH_AVX512));
#endif
}

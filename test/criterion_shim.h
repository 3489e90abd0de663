/* The part of Criterion's API that the header-only tests use, for targets
   where Criterion is not installed (the AArch64 build that test/aarch64.sh
   runs under qemu-user). Define MPQ_TEST_SHIM before test/common.h.

   The tests run in one process, in the order they are defined (not one
   process per test as under Criterion): a failed assertion prints its file, line, expression and
   message and returns to the runner (longjmp), which goes on with the next
   test; a crash ends the run, which then counts as failed. `.init` and
   `.fini` run around each test; `.timeout` is not enforced. The program
   prints TAP, one line per test, then "# N passed, N failed, N skipped",
   and exits non-zero when a test failed (_Exit: no atexit handlers). With an argument, only the tests
   whose "suite::name" contains it run. */
#ifndef MPQ_CRITERION_SHIM_H
#define MPQ_CRITERION_SHIM_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct shim_extra {
    int sentinel_;
    void (*init)(void);
    void (*fini)(void);
    double timeout;
    int disabled;
};

typedef struct shim_test {
    const char *suite, *name;
    int line;
    void (*fn)(void);
    const struct shim_extra *extra;
} shim_test;

#define SHIM_MAX_TESTS 512
static shim_test shim_tests[SHIM_MAX_TESTS];
static int shim_ntests;
static jmp_buf shim_back; /* to the runner, from a failed assertion or a skip */
enum { SHIM_FAILED = 1, SHIM_SKIPPED = 2 };

static inline void shim_add(const char *suite, const char *name, int line, void (*fn)(void), const struct shim_extra *x)
{
    if (shim_ntests == SHIM_MAX_TESTS) {
        fprintf(stderr, "criterion_shim: more than %d tests\n", SHIM_MAX_TESTS);
        exit(2);
    }
    shim_test t = {suite, name, line, fn, x};
    shim_tests[shim_ntests++] = t;
}

#define Test(suite, name, ...)                                                                                         \
    static void suite##_##name##_fn(void);                                                                             \
    static const struct shim_extra suite##_##name##_extra = {0, __VA_ARGS__};                                          \
    __attribute__((constructor)) static void suite##_##name##_reg(void)                                                \
    {                                                                                                                  \
        shim_add(#suite, #name, __LINE__, suite##_##name##_fn, &suite##_##name##_extra);                               \
    }                                                                                                                  \
    static void suite##_##name##_fn(void)

/* fmt starts with a space, then the caller's format, if any. */
__attribute__((format(printf, 4, 5), noreturn)) static inline void shim_fail(const char *file, int line,
                                                                             const char *expr, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: assertion failed: %s", file, line, expr);
    if (fmt[1]) {
        va_list ap;
        va_start(ap, fmt);
        fputc(':', stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    fflush(NULL);
    longjmp(shim_back, SHIM_FAILED);
}

__attribute__((format(printf, 1, 2), noreturn)) static inline void shim_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("skipped:", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(NULL);
    longjmp(shim_back, SHIM_SKIPPED);
}

/* The message is optional: " " __VA_ARGS__ is a format of one space without one. */
#define cr_assert(cond, ...) ((cond) ? (void)0 : shim_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__))
#define cr_assert_fail(...)  shim_fail(__FILE__, __LINE__, "cr_assert_fail", " " __VA_ARGS__)
#define SHIM_CMP(a, op, b, ...)                                                                                        \
    (((a)op(b)) ? (void)0 : shim_fail(__FILE__, __LINE__, #a " " #op " " #b, " " __VA_ARGS__))
#define cr_assert_eq(a, b, ...)           SHIM_CMP(a, ==, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...)          SHIM_CMP(a, !=, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)           SHIM_CMP(a, <, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...)          SHIM_CMP(a, <=, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)           SHIM_CMP(a, >, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...)          SHIM_CMP(a, >=, b, __VA_ARGS__)
#define cr_assert_null(p, ...)            SHIM_CMP((const void *)(p), ==, NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...)        SHIM_CMP((const void *)(p), !=, NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...)       SHIM_CMP(strcmp((a), (b)), ==, 0, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...)      SHIM_CMP(strcmp((a), (b)), !=, 0, __VA_ARGS__)
#define cr_assert_arr_eq(a, b, size, ...) SHIM_CMP(memcmp((a), (b), (size)), ==, 0, __VA_ARGS__)
/* Criterion's definition: both differences at most eps (false for NaN) */
#define cr_assert_float_eq(a, b, eps, ...)                                                                             \
    cr_assert((double)(b) - (double)(a) <= (double)(eps) && (double)(a) - (double)(b) <= (double)(eps), __VA_ARGS__)
#define cr_skip_test(...) shim_skip(" " __VA_ARGS__)
#define cr_log_info(...)  (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), (void)0)

static inline int shim_by_line(const void *a, const void *b)
{
    return ((const shim_test *)a)->line - ((const shim_test *)b)->line;
}

int main(int argc, char **argv)
{
    int n = 0;
    for (int k = 0; k < shim_ntests; k++) { /* the selected tests, in the order of definition */
        char full[256];
        snprintf(full, sizeof full, "%s::%s", shim_tests[k].suite, shim_tests[k].name);
        if (argc < 2 || strstr(full, argv[1])) shim_tests[n++] = shim_tests[k];
    }
    qsort(shim_tests, (size_t)n, sizeof shim_tests[0], shim_by_line);
    int passed = 0, failed = 0, skipped = 0;
    printf("TAP version 13\n1..%d\n", n);
    for (int k = 0; k < n; k++) {
        const shim_test *t = &shim_tests[k];
        fflush(NULL);
        if (t->extra->disabled) {
            printf("ok %d - %s::%s # SKIP disabled\n", k + 1, t->suite, t->name);
            skipped++;
            continue;
        }
        const int how = setjmp(shim_back);
        if (!how) {
            if (t->extra->init) t->extra->init();
            t->fn();
        }
        if (t->extra->fini) t->extra->fini();
        if (how == SHIM_FAILED) {
            printf("not ok %d - %s::%s\n", k + 1, t->suite, t->name);
            failed++;
        } else if (how == SHIM_SKIPPED) {
            printf("ok %d - %s::%s # SKIP\n", k + 1, t->suite, t->name);
            skipped++;
        } else {
            printf("ok %d - %s::%s\n", k + 1, t->suite, t->name);
            passed++;
        }
    }
    printf("# %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    fflush(NULL);
    _Exit(failed ? 1 : 0); /* no exit-time teardown of the threads' runtime (qemu-user aborts in it at times) */
}

#endif

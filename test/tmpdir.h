/* A scratch directory for tests that write files: made with mkdtemp under
   /tmp, removed with its (flat) contents. Needs _XOPEN_SOURCE 700. */
#ifndef MPQ_TEST_TMPDIR_H
#define MPQ_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline int tc_tmpdir_make(char *dir, size_t cap, const char *tag)
{
    snprintf(dir, cap, "/tmp/mpq-test-%s-XXXXXX", tag);
    return mkdtemp(dir) != NULL;
}

static inline void tc_tmpdir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

#endif

/* tools/cli.c - option tables parsed and printed (cli.h). */
#include "cli.h"

int cli_was_given(const cli_seen *s, const char *name)
{
    for (int i = 0; i < s->n; i++) {
        const char *p = s->opt[i]->names;
        const size_t n = strlen(name);
        for (const char *q = p; (q = strstr(q, name)) != NULL; q += n)
            if ((q == p || q[-1] == '|') && (q[n] == 0 || q[n] == '|')) return 1;
    }
    return 0;
}

/* The spelling of a row shown in messages: its last one ("--tokens"). */
static const char *cli_main_name(const cli_opt *o, char *buf, size_t cap)
{
    const char *bar = strrchr(o->names, '|');
    snprintf(buf, cap, "%s", bar ? bar + 1 : o->names);
    return buf;
}

/* Whether argument s is option o: 0 no, 1 yes (*val: the text after '=',
   or NULL). */
static int cli_match(const cli_opt *o, const char *s, const char **val)
{
    for (const char *p = o->names; *p;) {
        const char *e = strchr(p, '|');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!strncmp(s, p, n) && (s[n] == 0 || (s[n] == '=' && o->kind != CLI_FLAG))) {
            *val = s[n] == '=' ? s + n + 1 : NULL;
            return 1;
        }
        p += n + (e != NULL);
    }
    return 0;
}

/* The value of a choice: its index, or -1. */
static int cli_choice(const char *choices, const char *v)
{
    int k = 0;
    for (const char *p = choices; *p; k++) {
        const char *e = strchr(p, '|');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (strlen(v) == n && !strncmp(v, p, n)) return k;
        p += n + (e != NULL);
    }
    return -1;
}

/* The k-th of the choices "a|b|c" into buf. */
const char *cli_nth(const char *choices, int k, char *buf, size_t cap)
{
    const char *p = choices;
    for (int i = 0; i < k && p; i++) p = strchr(p, '|'), p = p ? p + 1 : NULL;
    const char *e = p ? strchr(p, '|') : NULL;
    snprintf(buf, cap, "%.*s", p ? (e ? (int)(e - p) : (int)strlen(p)) : 0, p ? p : "");
    return buf;
}

/* Stores value v of option o into field; 0 and a message when it is bad. */
static int cli_store(const char *cmd, const cli_opt *o, const char *v, void *field)
{
    char name[32];
    cli_main_name(o, name, sizeof name);
    char *end = NULL;
    switch (o->kind) {
    case CLI_FLAG: *(int *)field = 1; return 1;
    case CLI_INT: {
        const long x = strtol(v, &end, 10);
        if (!*v || *end || x < (long)o->lo || x > (long)o->hi)
            return fail(EXIT_USAGE, "%s %s: '%s' is not an integer in %.0f..%.0f", cmd, name, v, o->lo, o->hi), 0;
        *(int *)field = (int)x;
        return 1;
    }
    case CLI_DOUBLE: {
        const double x = strtod(v, &end);
        if (!*v || *end || !(x >= o->lo && x <= o->hi))
            return fail(EXIT_USAGE, "%s %s: '%s' is not a number in %g..%g", cmd, name, v, o->lo, o->hi), 0;
        *(double *)field = x;
        return 1;
    }
    case CLI_STR: *(const char **)field = v; return 1;
    case CLI_CHOICE: {
        const int k = cli_choice(o->choices, v);
        if (k < 0) { /* "is not a, b or c" */
            char list[256] = "", c[64];
            int n = 1;
            for (const char *p = o->choices; *p; p++) n += *p == '|';
            for (int i = 0; i < n; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         i == 0           ? ""
                             : i == n - 1 ? " or "
                                          : ", ",
                         cli_nth(o->choices, i, c, sizeof c));
            return fail(EXIT_USAGE, "%s %s: '%s' is not %s", cmd, name, v, list), 0;
        }
        *(int *)field = k;
        return 1;
    }
    case CLI_LIST: {
        cli_list *l = (cli_list *)field;
        if (l->n == CLI_LIST_MAX)
            return fail(EXIT_USAGE, "%s %s: given more than %d times", cmd, name, CLI_LIST_MAX), 0;
        l->v[l->n++] = v;
        return 1;
    }
    case CLI_PARSE:
        if (!o->parse(v, field)) return fail(EXIT_USAGE, "%s %s: '%s' is not %s", cmd, name, v, o->choices), 0;
        return 1;
    }
    return 0;
}

/* Prints the help: usage, about, the options of every set, the tail. */
void cli_help(const cli_spec *s)
{
    printf("usage: mpq %s %s\n\n%s\n", s->cmd, s->usage, s->about);
    int first = 1;
    for (int k = 0; k < 4 && s->sets[k].opts; k++)
        for (const cli_opt *o = s->sets[k].opts; o->names; o++) {
            if (first) putchar('\n'), first = 0;
            char head[64];
            const char *bar = strrchr(o->names, '|');
            if (bar) /* "-n, --tokens N" */
                snprintf(head, sizeof head, "%.*s, %s%s%s", (int)(bar - o->names), o->names, bar + 1, o->arg ? " " : "",
                         o->arg ? o->arg : "");
            else
                snprintf(head, sizeof head, "%s%s%s", o->names, o->arg ? " " : "", o->arg ? o->arg : "");
            const char *h = o->help;
            int line = 0;
            if (strlen(head) > 18) printf("  %s\n", head), head[0] = 0, line = 1;
            for (;;) {
                const char *e = strchr(h, '\n');
                const int n = e ? (int)(e - h) : (int)strlen(h);
                const int last = e == NULL;
                printf("  %-18s %.*s%s%s%s\n", line ? "" : head, n, h, last && o->def ? " (default " : "",
                       last && o->def ? o->def : "", last && o->def ? ")" : "");
                line = 1;
                if (last) break;
                h = e + 1;
            }
        }
    if (s->tail) printf("\n%s\n", s->tail);
}

/* Parses argv (argv[0] is the command) into the sets' structs (bases[k]
   for s->sets[k]) after setting every default; positional arguments go to
   pos (at most s->max_pos). Returns 0, -1 after printing the help, or
   EXIT_USAGE after a message. seen (may be NULL): the options given. */
int cli_parse(const cli_spec *s, int argc, char **argv, void *cmd_struct, size_t size, const char **pos, int *npos,
              cli_seen *seen)
{
    *npos = 0;
    if (seen) seen->n = 0;
    memset(cmd_struct, 0, size);
    char *base = (char *)cmd_struct;
    for (int k = 0; k < 4 && s->sets[k].opts; k++)
        for (const cli_opt *o = s->sets[k].opts; o->names; o++)
            if (o->def && !cli_store(s->cmd, o, o->def, base + s->sets[k].base + o->off)) return EXIT_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_help(s);
            return -1;
        }
        if (a[0] != '-' || !a[1]) {
            if (*npos == s->max_pos) {
                char u[96];
                snprintf(u, sizeof u, "%s", s->usage);
                return fail(EXIT_USAGE, "%s: '%s': one argument too many (usage: mpq %s %s)", s->cmd, a, s->cmd, u);
            }
            pos[(*npos)++] = a;
            continue;
        }
        const cli_opt *hit = NULL;
        const char *val = NULL;
        int set = 0;
        for (int k = 0; k < 4 && s->sets[k].opts && !hit; k++)
            for (const cli_opt *o = s->sets[k].opts; o->names && !hit; o++)
                if (cli_match(o, a, &val)) hit = o, set = k;
        if (!hit) return fail(EXIT_USAGE, "%s: unknown option '%s' (see mpq %s --help)", s->cmd, a, s->cmd);
        if (hit->kind != CLI_FLAG && !val) {
            if (i + 1 >= argc) return fail(EXIT_USAGE, "%s %s: needs a value", s->cmd, a);
            val = argv[++i];
        }
        if (!cli_store(s->cmd, hit, val, base + s->sets[set].base + hit->off)) return EXIT_USAGE;
        if (seen && seen->n < CLI_LIST_MAX) seen->opt[seen->n++] = hit;
    }
    if (*npos < s->min_pos) {
        const char *u = strncmp(s->usage, "[options] ", 10) ? s->usage : s->usage + 10;
        return fail(EXIT_USAGE, "%s: needs %s (see mpq %s --help)", s->cmd, u, s->cmd);
    }
    return 0;
}

/* tools/model_cmd.h - what the model commands (mpq_llm.c, schedule.c)
   share: a model loaded on a device, a text file, PMPD schedules as
   arguments. Implemented in mpq_llm.c. */
#ifndef MPQ_MODEL_CMD_H
#define MPQ_MODEL_CMD_H

#include "cli.h"
#include "mpq_model.h"

#include <stddef.h>

/* Positional MODEL and TEXT, for the commands that take them. */
#define MODEL_TEXT "MODEL TEXT"

typedef struct loaded {
    mpq_llm *m;
    mpq_backend be;
    int have_be;
} loaded;

/* Loads a model (GGUF, Hugging Face directory, safetensors) on o's device,
   with o's threads and 8-bit activations; a line about it on stderr unless
   quiet. 0, or an exit code after a message naming the file. */
int model_load(const char *path, const llm_opts *o, loaded *L);
void model_unload(loaded *L);

/* A whole file (NUL-terminated; *n bytes). 0, or an exit code. */
int text_read(const char *path, char **text, size_t *n);

/* A schedule written P:S@T,S@T,... (the prompt at skip P, decoded token T
   onwards at skip S), or a file whose first line is one (what `mpq
   schedule` writes); 0 when neither. */
int schedule_read(const char *v, mpq_pmpd_schedule *s);
/* The schedule as P:S@T,... */
void schedule_text(const mpq_pmpd_schedule *s, char *buf, size_t cap);

/* --schedule as the commands take it: a schedule, or learned:FILE. */
typedef struct schedule_arg {
    const char *text; /* as given; NULL: none */
    int learned;      /* learned:FILE (the file is text + 8) */
    mpq_pmpd_schedule s;
} schedule_arg;
#define SCHEDULE_WHAT "P:S@T,S@T,... with S and T increasing, a file holding one, or learned:FILE"
int schedule_arg_parse(const char *v, void *field);

#endif

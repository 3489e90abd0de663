/* examples/llm/rows.h - the rows of the main job's table, each given as the
   options of `mpq quantize` (tools/quantize_args.h), which quantize_row
   (examples/quantize_row.h) turns into the tool's recipe. The main job
   (llm_methods.c) measures what that makes; test_cli_llm checks, row by
   row, that it is byte for byte what `mpq quantize <options> --stats S
   --hessian H MODEL OUT` writes. */
#ifndef MPQ_LLM_ROWS_H
#define MPQ_LLM_ROWS_H

#include "quantize_row.h"

enum {
    ROW_QUICK = 1,      /* also in --quick */
    ROW_A8 = 2,         /* measured again with 8-bit activations (MixLLM's W*A8) */
    ROW_PMPD = 4,       /* PMPD's schedules measured on this model afterwards */
    ROW_SEQ = 8,        /* with --sequential CALIB: GPTQ's X^T X through the quantized layers before */
    ROW_MEASURE = 16,   /* with --measure MEASURE: the KL divergences `mpq measure` wrote for the row's
                           quantizer (LLM_MEASURE_ARGS) */
    ROW_MEASURE256 = 32 /* with --measure MEASURE256: the same at groups of 256 (LLM_MEASURE_ARGS --group 256) */
};

typedef struct llm_row {
    const char *family, *name;
    const char *args; /* mpq quantize's options (every row: --embed-bits 8 as well) */
    unsigned flags;
} llm_row;

/* Every method as its paper runs it, the plain-RTN variants beside them,
   and compositions; SFMP at group 256 for 2.25 and 3.25 bpw, as its table 3;
   the widths from measured KL divergences (auto) at the budgets of SFMP's
   rows (at 3.25 with SFMP's groups of 256) and at three bounds, under the
   same GPTQ. */
static const llm_row llm_rows[] = {
    {"RTN", "RTN 2-bit g128", "--method rtn --bits 2", 0},
    {"RTN", "RTN 3-bit g128", "--method rtn --bits 3", 0},
    {"RTN", "RTN 4-bit g128", "--method rtn --bits 4", ROW_QUICK},
    {"MXINT", "MXINT4", "--method rtn --format mxint --bits 4", 0},
    {"AWQ", "AWQ 3-bit g128", "--method awq --bits 3", 0},
    {"GPTQ", "GPTQ 2-bit g128 (act-order)", "--method gptq --bits 2 --act-order", 0},
    {"GPTQ", "GPTQ 3-bit g128 (act-order)", "--method gptq --bits 3 --act-order", 0},
    /* at 4 bits also MixLLM's W4A8 (its p0: uniform 4-bit weights, GPTQ) */
    {"GPTQ", "GPTQ 4-bit g128 (act-order)", "--method gptq --bits 4 --act-order", ROW_QUICK | ROW_A8},
    {"GPTQ", "GPTQ 3-bit g128", "--method gptq --bits 3", 0},
    {"AWQ+GPTQ", "AWQ + GPTQ 3-bit g128 (act-order)", "--method gptq --quantizer awq+gptq --bits 3 --act-order", 0},
    {"AWQ+GPTQ", "AWQ + GPTQ 4-bit g128 (act-order)", "--method gptq --quantizer awq+gptq --bits 4 --act-order", 0},
    {"AWQ", "AWQ 4-bit g128", "--method awq --bits 4", ROW_PMPD},
    {"SFMP", "SFMP 2.25 g256", "--method sfmp --bpw 2.25 --group 256", 0},
    {"SFMP", "SFMP 2.50 g128", "--method sfmp --bpw 2.5", 0},
    {"SFMP", "SFMP 3.00 g128", "--method sfmp --bpw 3", 0},
    {"SFMP", "SFMP 3.25 g256", "--method sfmp --bpw 3.25 --group 256", 0},
    {"SFMP", "SFMP 3.50 g128", "--method sfmp --bpw 3.5", ROW_QUICK},
    {"SFMP", "SFMP 4.25 g128", "--method sfmp --bpw 4.25", 0},
    {"SFMP+AWQ", "SFMP 2.25 g256 + AWQ", "--method sfmp --bpw 2.25 --group 256 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 3.25 g256 + AWQ", "--method sfmp --bpw 3.25 --group 256 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 3.50 g128 + AWQ", "--method sfmp --bpw 3.5 --quantizer awq", 0},
    {"SFMP+AWQ", "SFMP 4.25 g128 + AWQ", "--method sfmp --bpw 4.25 --quantizer awq", 0},
    {"SFMP+GPTQ", "SFMP 2.25 g256 + GPTQ (act-order)",
     "--method sfmp --bpw 2.25 --group 256 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 3.25 g256 + GPTQ (act-order)",
     "--method sfmp --bpw 3.25 --group 256 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 3.50 g128 + GPTQ (act-order)", "--method sfmp --bpw 3.5 --quantizer gptq --act-order", 0},
    {"SFMP+GPTQ", "SFMP 4.25 g128 + GPTQ (act-order)", "--method sfmp --bpw 4.25 --quantizer gptq --act-order", 0},
    /* compositions: SFMP's widths, AWQ's scales, GPTQ */
    {"SFMP+AWQ+GPTQ", "SFMP 3.25 g128 + AWQ + GPTQ (act-order)",
     "--method sfmp --bpw 3.25 --quantizer awq+gptq --act-order", 0},
    {"SFMP+AWQ+GPTQ", "SFMP 4.00 g128 + AWQ + GPTQ (act-order)",
     "--method sfmp --bpw 4 --quantizer awq+gptq --act-order", 0},
    /* the widths from each map's measured KL divergence (`mpq measure`, LLM_MEASURE_ARGS) */
    {"auto+GPTQ", "auto 3.00 + GPTQ (act-order)", "--method auto --bpw 3 --quantizer gptq --act-order", ROW_MEASURE},
    {"auto+GPTQ", "auto 3.25 g256 + GPTQ (act-order)",
     "--method auto --bpw 3.25 --group 256 --quantizer gptq --act-order", ROW_MEASURE256},
    {"auto+GPTQ", "auto 3.50 + GPTQ (act-order)", "--method auto --bpw 3.5 --quantizer gptq --act-order", ROW_MEASURE},
    {"auto+GPTQ", "auto 4.25 + GPTQ (act-order)", "--method auto --bpw 4.25 --quantizer gptq --act-order", ROW_MEASURE},
    {"auto+GPTQ", "auto KLD <= 0.1 + GPTQ (act-order)", "--method auto --max-kld 0.1 --quantizer gptq --act-order",
     ROW_MEASURE},
    {"auto+GPTQ", "auto KLD <= 0.05 + GPTQ (act-order)", "--method auto --max-kld 0.05 --quantizer gptq --act-order",
     ROW_MEASURE},
    {"auto+GPTQ", "auto KLD <= 0.02 + GPTQ (act-order)", "--method auto --max-kld 0.02 --quantizer gptq --act-order",
     ROW_MEASURE},
    {"MixLLM", "MixLLM 8/4 (10 % at 8 bits)", "--method mixllm --fraction 0.1 --bits 4", 0},
    {"MixLLM", "MixLLM 8/3 (10 % at 8 bits)", "--method mixllm --fraction 0.1 --bits 3", 0},
    /* and MixLLM's W4.4A8 */
    {"MixLLM+GPTQ", "MixLLM 8/4 (10 % at 8 bits) + GPTQ",
     "--method mixllm --fraction 0.1 --bits 4 --quantizer gptq --act-order", ROW_A8},
    /* MXSens at the least budget its 4/6/8 templates can meet (every map's
       8-bit block, 4 bits elsewhere), then half a bit more */
    {"MXSens", "MXSens at its lowest budget (MXINT 4/6/8)", "--method mxsens --bpw min", 0},
    {"MXSens", "MXSens at its lowest budget + 0.5 (MXINT 4/6/8)", "--method mxsens --bpw min+0.5", 0},
    /* ReQuant: 0.25 % outliers spread by eq. 9 and 0.25 % significant weights */
    {"ReQuant", "ReQuant on RTN 3-bit", "--method requant --bits 3", 0},
    {"ReQuant", "ReQuant on AWQ 3-bit", "--method requant --bits 3 --quantizer awq", 0},
    /* compositions: SFMP's plan, AWQ's scales and ReQuant's sparse part */
    {"SFMP+AWQ+ReQuant", "SFMP 3.25 g128 + AWQ + ReQuant", "--method sfmp --bpw 3.25 --quantizer awq --requant", 0},
    {"SFMP+AWQ+ReQuant", "SFMP 4.00 g128 + AWQ + ReQuant", "--method sfmp --bpw 4 --quantizer awq --requant", 0},
    /* the incoherence rotation (mpq.h, "AN INCOHERENCE ROTATION") under the
       same quantizers; SFMP's Fisher then comes from the statistics of the
       rotated weights (mpq calibrate --rotate 1 --stats fisher) */
    {"RTN+rot", "RTN 3-bit g128, rotated", "--method rtn --bits 3 --rotate 1", 0},
    {"RTN+rot", "RTN 4-bit g128, rotated", "--method rtn --bits 4 --rotate 1", 0},
    {"AWQ+rot", "AWQ 3-bit g128, rotated", "--method awq --bits 3 --rotate 1", 0},
    {"AWQ+rot", "AWQ 4-bit g128, rotated", "--method awq --bits 4 --rotate 1", 0},
    {"GPTQ+rot", "GPTQ 3-bit g128 (act-order), rotated", "--method gptq --bits 3 --act-order --rotate 1", 0},
    {"GPTQ+rot", "GPTQ 4-bit g128 (act-order), rotated", "--method gptq --bits 4 --act-order --rotate 1", 0},
    {"AWQ+GPTQ+rot", "AWQ + GPTQ 3-bit g128 (act-order), rotated",
     "--method gptq --quantizer awq+gptq --bits 3 --act-order --rotate 1", 0},
    {"AWQ+GPTQ+rot", "AWQ + GPTQ 4-bit g128 (act-order), rotated",
     "--method gptq --quantizer awq+gptq --bits 4 --act-order --rotate 1", 0},
    {"SFMP+GPTQ+rot", "SFMP 3.00 g128 + GPTQ (act-order), rotated",
     "--method sfmp --bpw 3 --quantizer gptq --act-order --rotate 1", 0},
    {"SFMP+GPTQ+rot", "SFMP 3.25 g256 + GPTQ (act-order), rotated",
     "--method sfmp --bpw 3.25 --group 256 --quantizer gptq --act-order --rotate 1", 0},
    {"SFMP+GPTQ+rot", "SFMP 3.50 g128 + GPTQ (act-order), rotated",
     "--method sfmp --bpw 3.5 --quantizer gptq --act-order --rotate 1", 0},
    {"SFMP+GPTQ+rot", "SFMP 4.25 g128 + GPTQ (act-order), rotated",
     "--method sfmp --bpw 4.25 --quantizer gptq --act-order --rotate 1", 0},
};
enum { LLM_NROWS = (int)(sizeof llm_rows / sizeof llm_rows[0]) };

/* The options every row adds: the token embedding (also the output head
   of SmolLM2) at 8 bits, as llama.cpp keeps it at Q8_0. */
#define LLM_ROW_COMMON "--embed-bits 8"

/* The measurement the ROW_MEASURE rows read: `mpq measure LLM_MEASURE_ARGS
   MODEL CALIB -o MEASURE` (examples/run.sh), the quantizer of those rows
   at four widths; ROW_MEASURE256 rows read the one made with `--group 256`
   added (MEASURE256). */
#define LLM_MEASURE_ARGS "--method gptq --act-order --widths 2,3,4,6"

#endif

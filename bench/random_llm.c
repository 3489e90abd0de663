/* bench_random_llm - a Llama-shaped model with random weights, for timing
   models larger than the ones at hand.

     bench_random_llm [options] DIR

   writes DIR/config.json, DIR/model.safetensors (linear maps, embedding
   and head in F16, norms in F32) and DIR/tokenizer.json (the 256 byte
   tokens of a byte-level BPE, no merges), which `mpq quantize` and the
   model commands read as a Hugging Face checkpoint. The shape defaults to
   Llama-3-70B's layers (the 8192 x 8192, 28672 x 8192 and 8192 x 28672
   products of the GEMV benchmarks) with Llama-2's vocabulary of 32000, so
   that the head does not outweigh a few layers:

     --dim N --ffn N --heads N --kv-heads N --layers N --vocab N --seed N

   --dtype bf16 stores the matrices in BF16 instead; --shards N writes N
   files model-0000i-of-0000N.safetensors (the embedding in the first, the
   head in the last, the layers spread evenly) and the index
   model.safetensors.index.json, as Hugging Face shards a checkpoint.

   Weights: Student-t(4) scaled to 1 / sqrt(columns) with a few outlier rows
   and columns (see fill); the same seed gives the same file for any thread
   count. Their values do not matter to a speed test. */
#define MPQ_IMPLEMENTATION
#include "mpq.h"
#include "mpq_io.h"
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The code point that spells byte b in a byte-level BPE vocabulary: the
   printable Latin-1 bytes stand for themselves, the others are numbered
   from 256 up in byte order. */
static unsigned byte_cp(int b)
{
    const int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) return (unsigned)b;
    unsigned k = 256;
    for (int c = 0; c < b; c++)
        k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
    return k;
}

/* W (m x n): Student-t(4) weights of scale 1 / sqrt(n) (a unit input gives
   outputs near 1), one row in 97 and one column in 97 multiplied by 4..16;
   rows in parallel, each from its own stream of `seed`. */
static void fill(float *W, int m, int n, uint64_t seed)
{
    const float f = 0.7f / sqrtf((float)n);
    synth_rng r = {seed};
    uint8_t *outc = calloc((size_t)n, 1);
    for (int j = 0; outc && j < n; j++) outc[j] = synth_int(&r, 97) == 0;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < m; i++) {
        synth_rng ri = {seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1))};
        const float g = synth_int(&ri, 97) ? f : f * (4.0f + 12.0f * (float)synth_unif(&ri));
        float *w = W + (size_t)i * n;
        for (int j = 0; j < n; j++) w[j] = g * synth_student4(&ri) * (outc && outc[j] ? 8.0f : 1.0f);
    }
    free(outc);
}

static int write_text(const char *dir, const char *name, const char *text)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "bench_random_llm: cannot write %s: %s\n", p, strerror(errno));
        return 0;
    }
    return 1;
}

static int write_tokenizer(const char *dir)
{
    char *j = malloc(1 << 16), *p = j;
    p += sprintf(p,
                 "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
                 "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                 "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        const unsigned cp = byte_cp(b);
        char u[8] = {0};
        if (cp < 0x80)
            u[0] = (char)cp;
        else
            u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
        p += sprintf(p, "%s\"%s%s\":%d", b ? "," : "", cp == '"' || cp == '\\' ? "\\" : "", u, b);
    }
    sprintf(p, "},\"merges\":[]}}");
    const int ok = write_text(dir, "tokenizer.json", j);
    free(j);
    return ok;
}

static int arg_int(const char *opt, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    const long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo || x > hi) {
        fprintf(stderr, "bench_random_llm: %s needs a number in %d..%d\n", opt, lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int main(int argc, char **argv)
{
    int dim = 8192, ffn = 28672, heads = 64, kv_heads = 8, layers = 2, vocab = 32000, seed = 1, shards = 1;
    mpq_dtype dt = MPQ_DT_F16;
    const char *dir = NULL;
    static const char *const names[] = {"--dim",    "--ffn",   "--heads", "--kv-heads",
                                        "--layers", "--vocab", "--seed",  "--shards"};
    int *vals[] = {&dim, &ffn, &heads, &kv_heads, &layers, &vocab, &seed, &shards};
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < 8 && strcmp(argv[i], names[k])) k++;
        if (k < 8) {
            if (!arg_int(names[k], i + 1 < argc ? argv[i + 1] : NULL, k == 6 ? 0 : 1, k == 7 ? 99 : 1 << 20, vals[k]))
                return 1;
            i++;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "f16") || !strcmp(argv[i + 1], "bf16"))) {
            dt = strcmp(argv[++i], "bf16") ? MPQ_DT_F16 : MPQ_DT_BF16;
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr,
                    "usage: bench_random_llm [--dim N --ffn N --heads N --kv-heads N --layers N --vocab N "
                    "--seed N --dtype f16|bf16 --shards N] DIR\n");
            return 1;
        } else {
            dir = argv[i];
        }
    }
    if (!dir || dim % heads || heads % kv_heads || (dim / heads) % 2 || vocab < 256) {
        fprintf(stderr,
                "bench_random_llm: needs DIR, heads dividing dim (an even head size), kv-heads dividing "
                "heads, a vocabulary of at least 256\n");
        return 1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_random_llm: cannot make %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
             "\"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "
             "\"tie_word_embeddings\": false, \"vocab_size\": %d, \"torch_dtype\": \"%s\"}\n",
             dim, ffn, layers, heads, kv_heads, vocab, dt == MPQ_DT_BF16 ? "bfloat16" : "float16");
    if (!write_text(dir, "config.json", cfg) || !write_tokenizer(dir)) return 1;
    if (shards > layers + 2) shards = layers + 2;

    char path[4096], name[128], shard[64];
    FILE *index = NULL; /* the index of the shards: tensor -> file, as it is written */
    if (shards > 1) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!(index = fopen(path, "wb"))) {
            fprintf(stderr, "bench_random_llm: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        fprintf(index, "{\"metadata\": {}, \"weight_map\": {");
    }
    int at = 0, nidx = 0; /* the shard being written; entries in the index */
    snprintf(shard, sizeof shard, shards > 1 ? "model-%05d-of-%05d.safetensors" : "model.safetensors", 1, shards);
    snprintf(path, sizeof path, "%s/%s", dir, shard);
    mpq_st_writer *w = NULL;
    mpq_io_err e;
    if (mpq_st_writer_open(path, &w, &e) != MPQ_OK || mpq_st_writer_reserve(w, 65536, &e) != MPQ_OK) {
        fprintf(stderr, "bench_random_llm: %s\n", e.msg);
        return 1;
    }
    const int hd = dim / heads;
    const int rows[7] = {dim, kv_heads * hd, kv_heads * hd, dim, ffn, ffn, dim};
    const int cols[7] = {dim, dim, dim, dim, dim, dim, ffn};
    static const char *const lin[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const size_t most = (size_t)(ffn > vocab ? ffn : vocab) * (size_t)dim; /* the largest tensor */
    float *W = malloc(sizeof(float) * most), *ones = malloc(sizeof(float) * (size_t)dim);
    if (!W || !ones) {
        fprintf(stderr, "bench_random_llm: out of memory\n");
        mpq_st_writer_abort(w);
        return 1;
    }
    synth_rng r = {(uint64_t)seed * 0x9E3779B97F4A7C15ull + 1};
    for (int i = 0; i < dim; i++) ones[i] = 1.0f + 0.1f * (float)synth_gauss(&r);
    mpq_status st = MPQ_OK;
    const uint64_t d1[1] = {(uint64_t)dim};
    /* the tensors in order: the embedding (-2), the layers (2 norms and 7 maps each), the head and the final
       norm (-1, last); the shard changes where the part of the order it covers ends */
    const int total = layers * 9 + 2;
    for (int u = 0; u < total && st == MPQ_OK; u++) {
        const int t = u == 0 ? -2 : u == total - 1 ? -1 : u - 1;
        const int want = (int)((long long)u * shards / total); /* the shard of tensor u */
        if (want != at) {
            if ((st = mpq_st_writer_close(w, &e)) != MPQ_OK) {
                w = NULL;
                break;
            }
            at = want;
            snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", at + 1, shards);
            snprintf(path, sizeof path, "%s/%s", dir, shard);
            if ((st = mpq_st_writer_open(path, &w, &e)) != MPQ_OK) {
                w = NULL;
                break;
            }
            if ((st = mpq_st_writer_reserve(w, 65536, &e)) != MPQ_OK) break;
        }
        const int l = t < 0 ? -1 : t / 9, k = t < 0 ? 0 : t % 9;
        if (t >= 0 && k < 2) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l,
                     k ? "post_attention_layernorm" : "input_layernorm");
            st = mpq_st_write_f32(w, name, MPQ_DT_F32, 1, d1, ones, &e);
        } else {
            const int m = t < 0 ? vocab : rows[k - 2], n = t < 0 ? dim : cols[k - 2];
            fill(W, m, n, synth_u64(&r));
            const uint64_t sh[2] = {(uint64_t)m, (uint64_t)n};
            if (t == -2)
                snprintf(name, sizeof name, "model.embed_tokens.weight");
            else if (t == -1)
                snprintf(name, sizeof name, "lm_head.weight");
            else
                snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, lin[k - 2]);
            st = mpq_st_write_f32(w, name, dt, 2, sh, W, &e);
        }
        if (index) fprintf(index, "%s\"%s\": \"%s\"", nidx++ ? ", " : "", name, shard);
        if (st == MPQ_OK && t == -1) {
            st = mpq_st_write_f32(w, "model.norm.weight", MPQ_DT_F32, 1, d1, ones, &e);
            if (index) fprintf(index, ", \"model.norm.weight\": \"%s\"", shard);
        }
        if (t >= 0 && k == 8) fprintf(stderr, "\rbench_random_llm: layer %d of %d", l + 1, layers);
    }
    fprintf(stderr, "\n");
    free(W), free(ones);
    if (st != MPQ_OK) {
        fprintf(stderr, "bench_random_llm: %s\n", e.msg);
        mpq_st_writer_abort(w);
        if (index) fclose(index);
        return 1;
    }
    if (mpq_st_writer_close(w, &e) != MPQ_OK) {
        fprintf(stderr, "bench_random_llm: %s\n", e.msg);
        if (index) fclose(index);
        return 1;
    }
    if (index && (fprintf(index, "}}\n") < 0 || fclose(index) != 0)) {
        fprintf(stderr, "bench_random_llm: cannot write the index: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

/* mpq_model.h - Llama-family language models on mpq's products.

   Beside the header, like mpq_io: mpq.h stays model-agnostic (matrices in,
   packed matrices and products out); this part loads real models, runs the
   forward pass with every linear map on mpq's products (or on float
   weights, the reference), and measures perplexity and generation; its
   text goes through mpq_tokenizer.h. Compiled from mpq_model.c and
   mpq_calib.c; needs mpq_io (cJSON), the tokenizer and a translation unit
   that defines MPQ_IMPLEMENTATION.

   CONTENTS
     1. Models ........ configuration, loading (GGUF, Hugging Face directory,
                        safetensors files written by mpq) or building in
                        memory, every parameter listed, float or packed
                        linear maps, the CPU or another backend
     2. Forward pass .. KV cache, batched prompts, one-token decode (of one or
                        several sequences at once), logits
     3. Perplexity .... llama.cpp's llama-perplexity, computed the same way;
                        KL divergence to a reference model's predictions
                        (recorded in a file, compared position by position)
     4. Generation .... greedy or temperature / top-p sampling, PMPD
                        precision schedules (given or from the learned
                        scheduler), prompt and decode timing; the learned
                        scheduler's training samples and its file
     5. Calibration ... the backward pass (the linear maps' gradients, or
                        every parameter's for training), and every
                        statistic the methods need (Fisher diagonal,
                        diag(X^T X), AWQ samples, MixLLM salience, PQI,
                        MXSens layer sensitivity, X^T X), streamed over
                        windows of a text; the statistics file `mpq
                        quantize` reads

   Every fallible function returns mpq_status and, where a file or a text is
   involved, fills an optional mpq_io_err with one line naming it. */
#ifndef MPQ_MODEL_H_INCLUDED
#define MPQ_MODEL_H_INCLUDED

#include "mpq.h"
#include "mpq_io.h"
#include "mpq_tokenizer.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ========================================================================== */
/* 1. Models                                                                  */
/* ========================================================================== */

/* A LLAMA-FAMILY MODEL (Llama 1-3, Mistral, Qwen2, SmolLM):

     x = embedding[token]
     for each layer:
       h = rmsnorm(x) * attn_norm
       q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv)     (heads, kv_heads, head_dim)
       rotate q and k by position (rotary, base rope_theta)
       x += Wo attention(q, k, v)          (causal; query head j uses kv head j / (heads / kv_heads))
       h = rmsnorm(x) * ffn_norm
       x += Wdown (silu(Wgate h) * Wup h)
     logits = head (rmsnorm(x) * out_norm)           (head = embedding when tied)

   rmsnorm(x) = x / sqrt(mean(x^2) + norm_eps). Attention scores are
   q.k / sqrt(head_dim), softmax over positions 0..t.

   ROTARY CONVENTION. A query or key vector is rotated in pairs by angle
   position * theta_i, theta_i = rope_theta^(-2i / head_dim). Hugging Face
   checkpoints pair element i with i + head_dim/2 (MPQ_ROPE_HALF); GGUF files
   of the llama architecture store the rows of Wq and Wk permuted so that the
   pairs are adjacent, (2i, 2i+1) (MPQ_ROPE_ADJACENT); GGUF qwen2 files keep
   the halves. The model rotates as its file stores, so either form of the
   same weights gives the same logits, and packed matrices keep the file's
   row order. Rotary scaling: none, "linear" (positions / factor) and
   "llama3" (Llama 3.1's frequency bands), or a GGUF rope_freqs tensor.

   NAMES. Tensors keep their file's names: GGUF (token_embd.weight,
   blk.N.attn_q.weight, ..., output_norm.weight, output.weight) or Hugging
   Face (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight,
   ..., model.norm.weight, lm_head.weight). mpq_llm_tensor_name gives the
   name of each role in either scheme.

   WHERE THE DESCRIPTION COMES FROM. GGUF: its metadata ({arch}.block_count,
   ...embedding_length, ...attention.head_count(_kv), ...rope.freq_base,
   ...attention.layer_norm_rms_epsilon, tokenizer.ggml.*). A Hugging Face
   directory: config.json (architectures LlamaForCausalLM,
   MistralForCausalLM or Qwen2ForCausalLM), tokenizer.json and
   tokenizer_config.json. A safetensors file: the same three texts from its
   __metadata__ (mpq quantize writes them, with "mpq_rope_pairs" saying how
   its q/k rows are paired) or beside it. Loading checks every shape against
   the description, that heads divide, that every float is finite, and names
   the file and tensor of anything wrong. */

typedef enum mpq_rope_style {
    MPQ_ROPE_HALF = 0,    /* pairs (i, i + head_dim/2): Hugging Face, GGUF qwen2 */
    MPQ_ROPE_ADJACENT = 1 /* pairs (2i, 2i + 1): GGUF llama */
} mpq_rope_style;

typedef enum mpq_rope_scaling {
    MPQ_ROPE_SCALING_NONE = 0,
    MPQ_ROPE_SCALING_LINEAR = 1,
    MPQ_ROPE_SCALING_LLAMA3 = 2
} mpq_rope_scaling;

typedef struct mpq_llm_config {
    char arch[32]; /* "llama" or "qwen2" (Mistral is "llama") */
    int vocab;     /* embedding rows */
    int dim, layers, heads, kv_heads, head_dim, ffn;
    int ctx; /* the context the model was trained for */
    double rope_theta, norm_eps;
    mpq_rope_style rope_style;
    mpq_rope_scaling rope_scaling;
    double rope_factor, rope_low_freq, rope_high_freq; /* scaling parameters */
    int rope_orig_ctx;                                 /* llama3 scaling: original_max_position_embeddings */
    int tied;                                          /* the head is the token embedding */
    int qkv_bias;                                      /* q, k and v have biases (Qwen2) */
    int gguf_names;                                    /* tensors are named as in GGUF */
} mpq_llm_config;

/* The linear maps of a layer, in this order everywhere. */
enum { MPQ_LIN_Q, MPQ_LIN_K, MPQ_LIN_V, MPQ_LIN_O, MPQ_LIN_GATE, MPQ_LIN_UP, MPQ_LIN_DOWN, MPQ_LIN_COUNT };

/* A weight matrix, rows x cols (y = W x), as float weights, as a packed
   matrix, or both: products use the packed matrix when there is one. */
typedef struct mpq_linear {
    int rows, cols;
    float *W;     /* float weights (the reference), or NULL */
    mpq_packed A; /* packed weights (A.buf NULL when none) */
    float *bias;  /* rows, or NULL */
    void *handle; /* A on the model's backend (not the CPU's), or NULL */
    /* The float weights in place instead of W (a model loaded with
       in_place): rows of ws_row bytes in the model file's read-only
       mapping, of ggml type ws_type (mpq_gguf_decode converts them). */
    const void *Ws;
    uint32_t ws_type;
    size_t ws_row;
} mpq_linear;

typedef struct mpq_llm_layer {
    float *attn_norm, *ffn_norm; /* dim */
    mpq_linear lin[MPQ_LIN_COUNT];
} mpq_llm_layer;

typedef struct mpq_llm {
    mpq_llm_config c;
    mpq_tokenizer *tok;
    mpq_llm_layer *layer;       /* c.layers */
    mpq_linear embed;           /* vocab x dim; lookups dequantize a row when packed */
    mpq_linear head;            /* vocab x dim; tied: a copy of embed's pointers, not owned */
    float *out_norm;            /* dim */
    float *rope_freq;           /* head_dim / 2 frequencies, scaling applied */
    const mpq_backend *backend; /* NULL: mpq_gemv on this CPU */
    int a8;                     /* 1: packed linear maps multiply 8-bit activations
                                   (mpq_gemv_opts.a8; the CPU and the "cuda" backend,
                                   not "cuda-fp16"); 0 -> float */
    mpq_path cpu_path;          /* the CPU kernels of packed products (mpq_gemv_opts.path);
                                   0 -> MPQ_PATH_AUTO */
    char *path;                 /* what it was loaded from */
    mpq_source *src;            /* the files, open while weights are used in place; else NULL */
    /* Called (when set) with the input of every linear map of the layers
       just before its product: x is tokens x cols. Calibration statistics
       (diag(X^T X), AWQ's activations) are gathered this way. */
    void (*observe)(void *user, int layer, int lin, const float *x, int tokens, int cols);
    void *observe_user;
    void *arena; /* the region the packed products were moved to (mpq_llm_load_opts), or NULL */
    size_t arena_bytes;
} mpq_llm;

/* The tensor name of a role in the naming scheme of gguf_names: role is
   "embed", "out_norm", "head", "attn_norm", "ffn_norm", or a linear map
   (MPQ_LIN_*, with `bias` for its bias); layer for the per-layer ones. */
const char *mpq_llm_tensor_name(int gguf_names, const char *role, int layer, char *buf, size_t cap);
const char *mpq_llm_linear_name(int gguf_names, int layer, int lin, int bias, char *buf, size_t cap);
/* The role of a tensor name: layer and MPQ_LIN_* of a linear map's weight
   (1), the head or embedding (2 with lin = -1 and -2), or 0. */
int mpq_llm_tensor_role(const char *name, int *layer, int *lin);

/* The description alone (no weights), from an open source: what `mpq
   quantize` needs to carry a model's description into its output. */
mpq_status mpq_llm_config_read(mpq_source *s, mpq_llm_config *c, mpq_io_err *err);
mpq_status mpq_tokenizer_read(mpq_source *s, mpq_tokenizer **t, mpq_io_err *err);
/* A config.json for c (malloc'ed): Hugging Face's fields plus
   "mpq_rope_pairs" and "mpq_tensor_names". */
mpq_status mpq_llm_config_json(const mpq_llm_config *c, char **json);

/* Load a model: path is a GGUF file, a Hugging Face directory or a
   safetensors file (see WHERE THE DESCRIPTION COMES FROM). Float tensors
   are read as float (GGUF's quantized types dequantized), packed matrices
   stay packed. */
mpq_status mpq_llm_load(const char *path, mpq_llm **out, mpq_io_err *err);

/* IN PLACE. With in_place, the matrices (the embedding, the head and every
   linear map) that are not packed stay in their files, in their stored type
   (F32, F16, BF16, F64, GGUF's block types), mapped read-only
   (mpq_linear.Ws): a product converts four rows at a time as it reaches
   them, so a model needs no float32 copy of its weights and the mapped
   pages count as the page cache, not as the process's own memory. The
   products give the bits of the float32 model (the same conversion, the
   same sums). Loading still reads every weight once to check that all are
   finite. The model keeps its files open; the forward pass checks before
   each call that none changed size or modification time since loading
   (MPQ_ERR_IO; mpq_llm_check_files names the file). Training needs the
   weights as float32 (MPQ_ERR_UNSUPPORTED on a model in place); every
   calibration statistic and sequential GPTQ convert one layer at a time.
   Norms and biases are float. */
typedef struct mpq_llm_load_opts {
    int in_place;
    /* Packed matrices (in place or not) are moved into one region of 2 MB
       pages, which the products read faster than 4 KB pages (the page
       cache's or malloc's; 8B decode 18.1 -> 19.6 GB/s), when they take
       less than half the memory available (Linux; mpq_llm.arena).
       packed_mapped = 1 keeps them as loading reads them: in place, views
       into the mapping where aligned, which costs no anonymous memory. */
    int packed_mapped;
} mpq_llm_load_opts;
mpq_status mpq_llm_load_with(const char *path, const mpq_llm_load_opts *o, mpq_llm **out, mpq_io_err *err);
mpq_status mpq_llm_check_files(const mpq_llm *m, mpq_io_err *err);
void mpq_llm_free(mpq_llm *m); /* NULL is accepted */

/* A model built in memory (to train one, or a synthetic test): description
   c, checked as loading checks it (arch "" is "llama"; vocab at least the
   tokenizer's size), and the tokenizer tok, which the model takes on
   success (the caller keeps it on error). Every weight is float: matrices
   and biases (q, k and v with qkv_bias) zero, norm gains one. */
mpq_status mpq_llm_create(const mpq_llm_config *c, mpq_tokenizer *tok, mpq_llm **out);

/* EVERY PARAMETER, in one order: the embedding, the head (untied models
   only), the output norm, then for each layer its attention and MLP norms,
   its seven linear maps (MPQ_LIN_* order) and the biases it has (the same
   order). mpq_llm_params fills p[0 .. min(count, cap)) and returns the
   count (p may be NULL with cap 0). */
typedef enum mpq_param_role {
    MPQ_PARAM_EMBED,
    MPQ_PARAM_HEAD,
    MPQ_PARAM_OUT_NORM,
    MPQ_PARAM_ATTN_NORM,
    MPQ_PARAM_FFN_NORM,
    MPQ_PARAM_LINEAR,
    MPQ_PARAM_BIAS
} mpq_param_role;

typedef struct mpq_llm_param {
    mpq_param_role role;
    int layer;      /* the per-layer roles; else -1 */
    int lin;        /* LINEAR and BIAS: MPQ_LIN_*; else -1 */
    int rows, cols; /* a matrix; a vector has cols 0 and rows values */
    size_t n;       /* values */
    float *data;    /* the model's float values (NULL where only packed or in place) */
    char name[96];  /* the tensor name in the model's naming scheme */
} mpq_llm_param;

int mpq_llm_params(const mpq_llm *m, mpq_llm_param *p, int cap);

/* Give linear map L a packed matrix (taking the buffer: *A is cleared); the
   float weights stay for later packings. mpq_linear_unpack drops it. */
mpq_status mpq_linear_set_packed(mpq_llm *m, mpq_linear *L, mpq_packed *A);
void mpq_linear_unpack(mpq_llm *m, mpq_linear *L);
/* Run the packed matrices on another backend (uploads every one, and every
   one packed later); NULL returns to the CPU. Float maps stay on the CPU. */
mpq_status mpq_llm_use_backend(mpq_llm *m, const mpq_backend *be);

/* Bits per weight over the packed linear maps of the layers (level as
   mpq_packed_bpw; skip_planes >= 0 gives the bits read at that skip,
   mpq_packed_bpw_skip), and their weight count; 0 when none is packed. */
double mpq_llm_bpw(const mpq_llm *m, int level, int skip_planes);
/* Bytes of every weight as the forward pass reads them (packed buffers,
   float arrays, the embedding once). */
uint64_t mpq_llm_weight_bytes(const mpq_llm *m);

/* ========================================================================== */
/* 2. Forward pass                                                            */
/* ========================================================================== */

/* A KV cache of `ctx` positions and the scratch of a forward pass over up to
   `batch` tokens at a time (longer calls are cut into pieces of `batch`).
   On a model with a backend that has a pin function (mpq_backend), init
   pins the scratch that the products read and write (mem) on it, and free
   unpins it: free a state before destroying the backend it was made on.
   Where the pin fails the state is made all the same, unpinned. */
typedef struct mpq_llm_state {
    int ctx, batch;
    int pos;        /* positions in the cache */
    float *kc, *vc; /* layers x ctx x kv_heads * head_dim */
    float *mem;     /* the scratch below, one allocation */
    float *x, *h, *q, *k, *v, *a, *g, *u, *scores, *rope;
    void *work; /* mpq_gemv tables */
    size_t work_bytes;
    float *dec;      /* rows of in-place weights converted, 4 x the widest map's cols per thread; or NULL */
    int dec_threads; /* threads dec has room for */
    int nthreads;    /* the most threads a piece runs on (omp_get_max_threads() at init) */
    int team;        /* threads of the last piece's parallel region; 1: it ran without one
                        (another backend, an observed model, one thread free) */
    void (*unpin)(void *ctx, void *p); /* the backend's, where mem is pinned; or NULL */
    void *unpin_ctx;
} mpq_llm_state;

mpq_status mpq_llm_state_init(const mpq_llm *m, int ctx, int batch, mpq_llm_state *s);
void mpq_llm_state_free(mpq_llm_state *s);
static inline void mpq_llm_state_reset(mpq_llm_state *s) { s->pos = 0; }

/* Run n tokens at positions s->pos .. s->pos + n - 1, appending to the
   cache (MPQ_ERR_RANGE when it would overflow, MPQ_ERR_ARG for a token
   outside the vocabulary: nothing is run then). Every packed linear map of
   the layers runs with skip_planes. logits (may be NULL): the vocab logits
   of tokens first .. n - 1, (n - first) x vocab floats. */
mpq_status mpq_llm_forward(const mpq_llm *m, mpq_llm_state *s, const int32_t *tokens, int n, int skip_planes,
                           float *logits, int first);

/* One decode step of n independent sequences (several users, beams): token
   i is appended to sequence seqs[i] at seqs[i]->pos. The linear maps run on
   the n tokens together (one product of batch n each), attention of each
   token over its own cache. work: the step's scratch, a state with batch
   >= n (else MPQ_ERR_SIZE) and ctx at least every sequence's; it may be one
   of seqs (its cache is not touched unless it is). seqs must be distinct
   (MPQ_ERR_ARG); a full cache is MPQ_ERR_RANGE; nothing is run then.
   logits (may be NULL): n x vocab floats. */
mpq_status mpq_llm_decode(const mpq_llm *m, mpq_llm_state *const *seqs, int n, const int32_t *tokens, int skip_planes,
                          mpq_llm_state *work, float *logits);

/* ========================================================================== */
/* 3. Perplexity                                                              */
/* ========================================================================== */

/* As llama.cpp's llama-perplexity (tools/perplexity, without --ppl-stride):
   the tokens are cut into chunks of ctx tokens (the remainder is dropped),
   the cache is cleared before each chunk, the first token of a chunk is
   replaced by BOS when the tokenizer adds BOS, and the model scores the
   second half: the logits at positions ctx/2 .. ctx-2 predict the tokens
   after them, ctx - 1 - ctx/2 per chunk. ppl = exp(mean negative log
   likelihood); ppl_err = ppl * sqrt(var(nll) / (count - 1)), llama.cpp's
   "+/-". With a PMPD schedule the first half of each chunk is the prompt
   (at its prefill_skip) and the token at position ctx/2 + t runs at
   mpq_pmpd_skip_at(schedule, t), as generation would run it: the scored
   tokens are read at the decode precisions of the schedule. */

/* KL DIVERGENCE TO A REFERENCE. A reference run (usually the unquantized
   model) records, at every scored position of the chunks, what it predicts:
   its `top` most probable tokens (most probable first, the lower id first on
   ties) with their log-probabilities, the probability of every other token
   together (`rest`), and the log-probability of the text's next token. A
   later run of any model on the same tokens compares its own distribution Q
   with that record P at each position:

     KLD   = sum_k P_k (log P_k - log Q_k) + P_rest (log P_rest - log Q_rest)

   over the top tokens k and the rest taken as one outcome: the divergence
   of the two distributions coarsened to top + 1 outcomes, which is at most
   the full divergence (data processing) and equals it when top covers the
   vocabulary. Q's terms are computed as the record's were (log-probability
   to float, the rest summed in double over the other tokens in id order),
   so the reference against itself gives exactly 0. Also per position: the
   same top token (Q's most probable, lower id on ties, is P's first), and
   Delta p = Q(next) - P(next) of the text's next token. These are what
   llama.cpp's llama-perplexity --kl-divergence prints; it stores every
   token's logit (2 bytes each), this record 8 bytes per kept token: at the
   default top 1024, 67 MB for 32 chunks of 512 on a vocabulary of 49152,
   where the coarsened KLD of a 4-bit SmolLM2-135M came out 2.4 % below the
   full one (bench/results/NOTES.md, "KL divergence"). */
typedef struct mpq_kl_base {
    int vocab, ctx, chunks, top; /* top <= vocab tokens kept per position */
    long positions;              /* chunks * (ctx - 1 - ctx/2), in order */
    uint64_t tokens_hash;        /* mpq_kl_tokens_hash of the chunks as evaluated */
    uint64_t vocab_hash;         /* mpq_kl_vocab_hash of the tokenizer */
    int32_t *ids;                /* positions x top */
    float *logp;                 /* positions x top: log P of ids, non-increasing */
    float *rest;                 /* positions: P of every token not in ids, in [0, 1] */
    float *next_logp;            /* positions: log P of the text's next token */
} mpq_kl_base;

typedef struct mpq_kl_result {
    long count;                     /* positions compared */
    double kld, kld_err;            /* mean KLD (nats) and its standard error */
    double median, p90, p99, max;   /* of the positions' KLD (linear interpolation) */
    double same_top, same_top_err;  /* fraction of positions with the same top token */
    double dp_mean, dp_rms, dp_abs; /* Delta p: mean, root mean square, mean |Delta p| */
} mpq_kl_result;

typedef struct mpq_ppl_opts {
    int ctx;                           /* 0 -> 512 */
    int chunks;                        /* at most this many chunks; 0 -> all */
    int skip_planes;                   /* for every packed linear map (without a schedule) */
    const mpq_pmpd_schedule *schedule; /* may be NULL */
    int batch;                         /* tokens per forward piece; 0 -> 64 */
    /* called after each chunk (may be NULL) */
    void (*progress)(void *user, int done, int total, double ppl_so_far, double seconds);
    void *user;
    /* KL divergence (may be NULL): record this run's predictions into
       *kl_record (overwritten on success; mpq_kl_base_free), keeping kl_top tokens per
       position (0 -> 1024, at most the vocabulary); or compare this run with
       *kl_ref (which must match the run: mpq_kl_base_check). Both may be
       given. */
    mpq_kl_base *kl_record;
    int kl_top;
    const mpq_kl_base *kl_ref;
} mpq_ppl_opts;

typedef struct mpq_ppl_result {
    double ppl, ppl_err, nll; /* nll: mean nats per scored token */
    long count;               /* tokens scored */
    int chunks;
    double seconds, tokens_per_second; /* all tokens of the chunks run */
    mpq_kl_result kl;                  /* with kl_ref; zero otherwise */
} mpq_ppl_result;

mpq_status mpq_llm_perplexity(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_ppl_opts *o,
                              mpq_ppl_result *r);

/* FNV-1a (64-bit) of the chunks mpq_llm_perplexity would evaluate for
   these tokens, ctx and chunks (0: all), each chunk as run (its first token
   BOS when the tokenizer adds BOS). */
uint64_t mpq_kl_tokens_hash(const mpq_tokenizer *t, const int32_t *tokens, size_t n, int ctx, int chunks);
/* FNV-1a (64-bit) of a tokenizer: every token's bytes and kind, BOS, EOS,
   whether it adds BOS, and its pre-tokenizer. */
uint64_t mpq_kl_vocab_hash(const mpq_tokenizer *t);

/* Whether `b` was recorded on the run these arguments make (same
   vocabulary and tokenizer, ctx, number of chunks and tokens): MPQ_OK, or
   MPQ_ERR_ARG with a line in err saying what differs (origin: the file's
   name, may be NULL). ctx and chunks as in mpq_ppl_opts. */
mpq_status mpq_kl_base_check(const mpq_kl_base *b, const mpq_llm *m, const int32_t *tokens, size_t n, int ctx,
                             int chunks, const char *origin, mpq_io_err *err);

/* The record as a safetensors file (tensors kl.ids, kl.logp, kl.rest,
   kl.next_logp; metadata "mpq_kl_base": the sizes and hashes as JSON, and
   extra_json under "source" when given) and back. The reader checks every
   size, hash and value (ids in the vocabulary, log-probabilities <= 0 and
   non-increasing, rest in [0, 1]) and names the file in err. */
mpq_status mpq_kl_base_write(const mpq_kl_base *b, const char *extra_json, const char *path, mpq_io_err *err);
mpq_status mpq_kl_base_read(const char *path, mpq_kl_base *out, mpq_io_err *err);
void mpq_kl_base_free(mpq_kl_base *b); /* NULL and zeroed records are accepted */

/* ========================================================================== */
/* 4. Generation                                                              */
/* ========================================================================== */

/* The prompt runs in one batched pass, then one token at a time with the
   cache. PMPD: with a schedule the prompt runs at its prefill_skip and the
   pass that takes decoded token t (0-based: the first token sampled from
   the prompt's logits is t = 0) runs at mpq_pmpd_skip_at(schedule, t), so
   the bits read fall at the switch points; without one every pass runs at
   skip_planes. Sampling: temperature 0 is greedy (the lowest id among equal
   logits); otherwise softmax(logits / temperature), cut to the most likely
   tokens whose probabilities sum to top_p, drawn with a seeded generator. A
   token that ends a generation (mpq_token_is_end) stops it and is kept.
   PMPD's learned scheduler (mpq.h section 12): with `learned` the prompt
   runs at its prefill_skip, the network reads the keys and values the
   prompt left in the cache of its layer (positions 0 .. n-1, every kv head
   side by side: dk = dv = kv_heads x head_dim) and its schedule runs the
   decoding, as a given schedule would. */
typedef struct mpq_gen_opts {
    int max_tokens;    /* 0 -> until an end token or a full cache */
    float temperature; /* 0 -> greedy */
    float top_p;       /* 0 -> 1 */
    uint64_t seed;
    int skip_planes;
    const mpq_pmpd_schedule *schedule; /* may be NULL */
    const mpq_pmpd_learned *learned;   /* may be NULL; not with schedule */
    /* called with every new token (may be NULL); nonzero stops */
    int (*on_token)(void *user, int32_t token);
    void *user;
} mpq_gen_opts;

typedef struct mpq_gen_result {
    int prompt_tokens, tokens; /* tokens generated (out) */
    int ended;                 /* stopped by an end token */
    double prefill_seconds, decode_seconds;
    int tokens_at_skip[MPQ_MAX_BITS]; /* decode passes per skip level */
    double seconds_at_skip[MPQ_MAX_BITS];
    mpq_pmpd_schedule schedule; /* the schedule that ran (learned: the predicted one) */
    int learned_class;          /* learned: the predicted class; else -1 */
    double schedule_seconds;    /* learned: the prediction's time */
} mpq_gen_result;

/* Generates into out (capacity max_out tokens) after clearing s. The
   prompt must fit the cache with one free position (MPQ_ERR_RANGE). */
mpq_status mpq_llm_generate(const mpq_llm *m, mpq_llm_state *s, const int32_t *prompt, int n, const mpq_gen_opts *o,
                            int32_t *out, int max_out, mpq_gen_result *r);

/* TRAINING DATA FOR THE LEARNED SCHEDULER (PMPD appendix A.1.2, with the
   static scheduler's criterion in place of ROUGE-L). A window of prompt +
   length + 1 tokens (its first token replaced by BOS when the tokenizer adds
   BOS, as in mpq_llm_perplexity): the first `prompt` tokens run at
   n->prefill_skip; then, teacher-forced, the pass of decoded token t
   (t = 0 .. length-1, token prompt + t) predicts token prompt + t + 1, at
   the precision class c's schedule gives token t (mpq_pmpd_learned_class_
   schedule). nll[c] (n->classes): the mean negative log-likelihood of the
   `length` predicted tokens under class c, n->length = length. K and V (may
   be NULL; prompt x kv_heads * head_dim each): the cache of n->layer after
   the prompt, the scheduler's input. The classes share their common
   prefix: prompt + length + about (classes - 1) length / 2 tokens run.
   s: a state with ctx >= prompt + length; its cache is overwritten, and
   afterwards positions 0 .. prompt-1 of every layer hold the prompt's keys
   and values (other layers' scheduler inputs). */
mpq_status mpq_llm_pmpd_sample(const mpq_llm *m, mpq_llm_state *s, const int32_t *tokens, int prompt,
                               const mpq_pmpd_learned *n, double *nll, float *K, float *V);

/* THE LEARNED SCHEDULER'S FILE (safetensors, F32): tensors pmpd.q (dk),
   pmpd.w1 (hidden x dv), pmpd.b1 (hidden), pmpd.w2 (classes x hidden),
   pmpd.b2 (classes), pmpd.mean and pmpd.inv_sd (dv), and in __metadata__
   "mpq_pmpd_learned", a JSON object with layer, prefill_skip, skip_high,
   skip_low, length and `source` (extra_json, may be NULL). Reading checks
   every shape, value (mpq_pmpd_learned_validate) and, with m (may be
   NULL), that the layer exists and dk = dv = kv_heads x head_dim; n is
   allocated as by mpq_pmpd_learned_init. */
mpq_status mpq_pmpd_learned_write(const mpq_pmpd_learned *n, const char *extra_json, const char *path, mpq_io_err *err);
mpq_status mpq_pmpd_learned_read(const mpq_llm *m, const char *path, mpq_pmpd_learned *n, mpq_io_err *err);


/* ========================================================================== */
/* 5. Calibration                                                             */
/* ========================================================================== */

/* THE BACKWARD PASS. mpq_llm_backward runs one window of n tokens (positions
   0..n-1, no cache) through the model with float weights and returns the
   language-model loss, the mean over positions 0..n-2 of -log p(token[t+1]),
   and, one linear map at a time (last layer first), the gradient of that
   loss with respect to the map's weights (rows x cols, the map's own row
   order) through on_grad. Every linear map of the layers and the head must
   have float weights (MPQ_ERR_UNSUPPORTED otherwise); W (may be NULL)
   replaces the weights of linear map i (index layer * MPQ_LIN_COUNT + lin)
   by W[i] where W[i] is not NULL, for gradients at other weights (PQI).
   observe (may be NULL) sees the input of every linear map as in
   mpq_llm.observe (q, k and v: once, as MPQ_LIN_Q; gate and up: once, as
   MPQ_LIN_GATE). Results do not depend on the number of threads. */
typedef struct mpq_llm_train mpq_llm_train;

/* Scratch for windows of up to `len` tokens (layers x len x about
   dim + 2 ffn floats of saved activations, heads x len^2 floats of
   attention, len x vocab floats of logits, and the head transposed). */
mpq_status mpq_llm_train_init(const mpq_llm *m, int len, mpq_llm_train **out);
void mpq_llm_train_free(mpq_llm_train *t); /* NULL is accepted */

typedef void (*mpq_grad_cb)(void *user, int layer, int lin, const float *G, int rows, int cols);
typedef void (*mpq_observe_cb)(void *user, int layer, int lin, const float *x, int tokens, int cols);

mpq_status mpq_llm_backward(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int n, const float *const *W,
                            mpq_observe_cb observe, mpq_grad_cb on_grad, void *user, double *loss);

/* EVERY PARAMETER'S GRADIENT (training): the loss of the window as
   mpq_llm_backward gives it, and its gradient with respect to every
   parameter added to grad[i] (i in mpq_llm_params order, p[i].n floats;
   the head's gradient goes to the embedding's when they are tied), so that
   calls over the windows of a batch sum. Every parameter must be float
   (MPQ_ERR_UNSUPPORTED). The weights may change between calls: the pass
   reads them anew each time. */
mpq_status mpq_llm_backward_params(const mpq_llm *m, mpq_llm_train *t, const int32_t *tokens, int n, float *const *grad,
                                   double *loss);

/* STATISTICS, over `windows` windows of `length` tokens taken evenly from
   the text (window i starts at token floor(i * (n / length) / windows) *
   length; the first token of each becomes BOS when the tokenizer adds
   BOS, as in mpq_llm_perplexity). For linear map i = layer * 7 + lin:

     fisher[i]    rows x cols  mean over windows of the squared gradient of
                               the window's loss (SFMP, SqueezeLLM)
     mixllm[i]    rows         MixLLM eq. 4: mean over windows of
                               |g_c.d_c + (g_c.d_c)^2 / 2| per output channel,
                               d = Q(W) - W for Q = RTN mixllm_bits, g128
     xtx_diag[i]  cols         diag(X^T X): sum of x_j^2 over the tokens
     mean_abs[i]  cols         mean |x_j| over the tokens
     awq[i]       awq_tokens x cols  input rows for AWQ's search, evenly
                               spaced over all windows
     xtx[i]       cols x cols  X^T X over every position, the sink included
                               (only with MPQ_CALIB_XTX: cols^2 each; GPTQ)
     pqi[i]       rows x cols  PQI eq. 7 along W -> Q(W), Q = RTN pqi_bits
                               g128, with pqi_steps gradient points of the
                               mean loss over the first pqi_windows windows
     layer_sens[i]             MXSens alg. 3: the squared L2 change of the
                               final hidden state (after the output norm)
                               over the first sens_tokens tokens of window
                               0 when only map i is MXINT4 (group 32),
                               divided by the largest change (mpq_mxsens_
                               layer_sensitivity)

   The activation statistics but xtx leave out position 0 of every window:
   there the model puts an attention sink whose inputs are orders of
   magnitude larger in a few channels, and a statistic summed over tokens
   would be that one token's (bench/results/NOTES.md). GPTQ's X^T X keeps
   it: without it GPTQ moves the weights of those channels freely (they
   look ordinary on the other tokens) and the sink's outputs break (SmolLM2
   3-bit: perplexity 102 without, 56 with). A LAYER AT A TIME: every
   statistic is gathered by passes that take one layer at a time: every
   window's hidden state passes layer l before any passes l + 1 (the
   activation statistics of l are then final), and the backward pass goes
   from the top layer down, each layer's activations recomputed from its
   input kept by the forward pass (memory up to keep_bytes, else a spill
   file). The sums are those of one window at a time through the whole
   model, in the same order: the same bits. Memory: one layer's weights as
   float32 (converted, for a model in place) and its sums (8 bytes per
   weight for Fisher, 4 for MixLLM's delta, X^T X of its four inputs in
   float64), every window's hidden state and gradient, and the results (all
   of them with mpq_llm_calibrate; one map's at a time with
   mpq_llm_calibrate_file). PQI (a pass of its own after those) runs every
   (step, window) pair as a sequence of its own, with every map at its
   point of that step: pqi_steps x pqi_windows hidden states and gradients,
   their kept inputs, and a layer's weights, points, target, gradient and
   float64 sums (24 bytes per weight of one layer, 32 rotated); the same
   bits as mpq_pqi along the flat vector of every map. layer_sens runs the
   float sequence and one sequence per map already quantized through layer
   l, then starts one from l's float input for each of l's maps: nlin + 1
   hidden states of sens_tokens x dim (kept as the inputs are), the same
   bits as restarting the whole forward pass at each map's layer.
   Deterministic for any thread count.

   ROTATED STATISTICS (rotate = 1): what a recipe with rotate and the same
   seed quantizes is W' = W V^T per map (V of the map's column count, as
   mpq_rotation_init makes it), and the planners' salience and ReQuant's
   PQI must be those of W'. None of them follows from the unrotated ones
   (each is a sum of squares or of absolute values per weight or column),
   so each is gathered in that basis, exactly: fisher from the window
   gradients G V^T (the gradient with respect to W'); mixllm from G V^T
   and d = Q(W') - W'; xtx_diag and mean_abs from the inputs V x; pqi along
   W' -> Q(W') with the gradients G V^T, the model run at W = W' V; and
   layer_sens with each map at MXINT4(W') V. The two statistics that are
   linear in the inputs, the AWQ rows and X^T X, stay in original
   coordinates: the recipe rotates them exactly (X V^T, V H V^T), so one
   such file serves rotated and unrotated recipes. The file records the
   seed ("rotate_seed" in its metadata). V x costs n (log2 p + m) per
   vector: a few percent more time; memory grows by one window's largest
   input block (or map) and, with PQI, 4 bytes per weight. */
#define MPQ_CALIB_FISHER     0x01u
#define MPQ_CALIB_MIXLLM     0x02u
#define MPQ_CALIB_ACTS       0x04u /* xtx_diag, mean_abs, awq */
#define MPQ_CALIB_PQI        0x08u
#define MPQ_CALIB_LAYER_SENS 0x10u
#define MPQ_CALIB_XTX        0x20u
#define MPQ_CALIB_ALL        0x1Fu /* everything but the full X^T X */
#define MPQ_CALIB_KEEP_BYTES ((size_t)1 << 30)

typedef struct mpq_calib_opts {
    unsigned what;   /* MPQ_CALIB_*; 0 -> MPQ_CALIB_ALL */
    int windows;     /* 0 -> 16 */
    int length;      /* tokens per window; 0 -> 512 */
    int awq_tokens;  /* 0 -> 128 */
    int mixllm_bits; /* the low width of MixLLM's delta; 0 -> 4 */
    int pqi_bits;    /* 0 -> 3 */
    int pqi_steps;   /* 0 -> 4 */
    int pqi_windows; /* 0 -> 4 (at most windows) */
    int sens_tokens; /* 0 -> 256 (at most length) */
    int rotate;      /* 1: in the basis of mpq_recipe.rotate (see ROTATED STATISTICS) */
    uint64_t rotate_seed;
    /* With Fisher or MixLLM, every window's input of every layer is kept
       for the backward pass (layers x windows x length x dim floats; PQI:
       layers x pqi_steps x pqi_windows of them; layer_sens: nlin + 1
       sequences of sens_tokens x dim): in memory up to keep_bytes (0 ->
       MPQ_CALIB_KEEP_BYTES), else in an unlinked file in spill_dir (NULL ->
       $TMPDIR, else /tmp). */
    size_t keep_bytes;
    const char *spill_dir;
    /* RESUMABLE (the statistics gathered a layer at a time): with
       resume_dir (a directory that exists), each layer's results, the
       hidden states or gradients where the passes stand, and the kept
       inputs go there as each layer ends (each file written whole, then
       renamed into place), so that a run stopped at any point continues
       from the last finished layer when called again with the same
       directory, model, tokens and options; another model, text or options
       there is MPQ_ERR_ARG naming the directory. Every pass resumes so:
       phase 1's forward and backward passes, PQI's and the layer
       sensitivity's. The statistics reach the caller once every pass is
       done (then the directory's files are removed). cancel (may be NULL)
       is asked after each layer of each pass: non-zero stops the run with
       MPQ_ERR_CANCELLED (with resume_dir, resumable from there). */
    const char *resume_dir;
    int (*cancel)(void *user);
    /* called during the passes (may be NULL): phase "forward", "backward"
       (layers x windows steps), "pqi" or "sensitivity", steps done of total,
       seconds since the start; user is also cancel's */
    void (*progress)(void *user, const char *phase, int done, int total, double seconds);
    void *user;
} mpq_calib_opts;

typedef struct mpq_calib_stats {
    int nlin; /* layers x MPQ_LIN_COUNT */
    int windows, length, awq_tokens, mixllm_bits, pqi_bits, pqi_steps, pqi_windows, sens_tokens;
    unsigned what;
    int rotate; /* 1: gathered in the basis of the rotation from rotate_seed */
    uint64_t rotate_seed;
    double loss;     /* mean loss over the windows (nats per token) */
    long act_tokens; /* tokens in the activation statistics */
    float **fisher, **mixllm, **xtx_diag, **mean_abs, **awq, **xtx, **pqi; /* nlin each, or NULL arrays */
    float *layer_sens;                                                     /* nlin, or NULL */
} mpq_calib_stats;

/* A text of fewer than `length` tokens is MPQ_ERR_SIZE (err says so); with
   fewer than windows x length, the windows are as many as fit. */
mpq_status mpq_llm_calibrate(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_opts *o,
                             mpq_calib_stats *out, mpq_io_err *err);
void mpq_calib_stats_free(mpq_calib_stats *s);

/* MEASURED SENSITIVITY (for mpq.h's allocation, section 11): how far the
   model's next-token distribution moves when one linear map alone is
   quantized. For every linear map i = layer * 7 + lin and every width
   bits[k], kld[i * nbits + k] is the mean over the positions of `windows`
   windows of `length` tokens (taken from the text as mpq_llm_calibrate
   takes them) of KL(P || Q) in nats: P the float model's distribution, Q
   the model's with map i replaced by what quantize(user, i, bits[k], W,
   Wq) writes to Wq (rows x cols, the dequantized weights in the
   coordinates of W: the caller's quantizer, whatever it is; it is called
   once per map and width). The KLD is taken in float64 from the float
   logits, exactly 0 where Q's logits equal P's.

   A layer at a time, as the layer sensitivity runs: each window's float
   sequence and one sequence per (map, width) already quantized pass layer
   l; then each of l's maps starts its sequences from the float input of
   l; at the top, each window's float logits, then each sequence's through
   the head. The results are those of restarting the forward pass at each
   map's layer (and, to float rounding, of whole forward passes with the map
   replaced: the tests check that against a float64 reference). Memory:
   one layer's weights, nlin x nbits x windows hidden states of length x
   dim (in memory up to keep_bytes, else in an unlinked file in spill_dir),
   and three length x vocab arrays for the head. Cost per window and width:
   7 L (L + 1) / 2 layer passes and 7 L head products over length tokens.
   Deterministic for any thread count. */
typedef mpq_status (*mpq_measure_quantize_fn)(void *user, int i, int bits, const float *W, float *Wq);

typedef struct mpq_measure_opts {
    const int *bits; /* the widths measured, each 1..8 */
    int nbits;
    mpq_measure_quantize_fn quantize; /* required */
    int windows;                      /* 0 -> 1 (as many as the text holds, at most) */
    int length;                       /* tokens per window; 0 -> 256 */
    size_t keep_bytes;                /* 0 -> MPQ_CALIB_KEEP_BYTES */
    const char *spill_dir;            /* NULL -> $TMPDIR, else /tmp */
    /* asked after each layer and each window's head: non-zero stops with MPQ_ERR_CANCELLED */
    int (*cancel)(void *user);
    /* phase "measure": thousandths of the work done (layer passes, the heads
       last), of 1000, and seconds since the start */
    void (*progress)(void *user, const char *phase, int done, int total, double seconds);
    void *user; /* quantize's, cancel's and progress's */
} mpq_measure_opts;

/* kld: nlin x nbits (the caller's). A text shorter than one window is
   MPQ_ERR_SIZE; a quantizer's error or NaN / Inf in its output stops the
   run with that status (MPQ_ERR_NONFINITE), err naming the map and width;
   nothing is written to kld on an error. */
mpq_status mpq_llm_measure(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_measure_opts *o, double *kld,
                           mpq_io_err *err);

/* The measurements as a file: a safetensors file with one float32 tensor
   NAME.kld of nbits values per linear map (NAME: its tensor's name) and
   what they are of in the metadata "mpq_measure" (a JSON object with the
   fields below; `mpq measure` writes it, `mpq quantize --method auto`
   reads it). */
typedef struct mpq_measure_info {
    int bits[8], nbits;     /* the widths measured: distinct, 1..8 */
    int windows, length;    /* of the text */
    uint64_t text_hash;     /* mpq_text_hash of the text */
    size_t tokens;          /* the text's */
    char model[128];        /* the model file's name (its last path component) */
    int layers, dim, vocab; /* and its shape */
    char quantizer[16];     /* "rtn", "awq", "gptq" or "awq+gptq" */
    int act_order, group, symmetric, rotate;
    uint64_t rotate_seed;
    double seconds; /* the measurement's */
} mpq_measure_info;

/* Writes kld (n x info->nbits, finite and >= 0) for the maps names[0 ..
   n-1]: a new file at path, or none on an error. */
mpq_status mpq_measure_write(const char *path, const mpq_measure_info *info, const char *const *names, int n,
                             const double *kld, mpq_io_err *err);
/* Reads what mpq_measure_write wrote to f (path names it in messages):
   *info, and with names, kld[i * nbits + k] for map names[i] (the caller's,
   n x nbits). MPQ_ERR_FORMAT, err naming the file and the field or tensor,
   for metadata missing or malformed, a map without its tensor or with
   another count of values, and values not finite or negative; nothing is
   written to kld then. */
mpq_status mpq_measure_read(mpq_st_file *f, const char *path, const char *const *names, int n, mpq_measure_info *info,
                            double *kld, mpq_io_err *err);

/* SEQUENTIAL QUANTIZATION (GPTQ's own order, and GPTQModel's default):
   the linear maps of layer l are quantized with X^T X of the inputs they
   see when layers 0 .. l-1 are already quantized, so that each layer's
   error feedback also absorbs what the earlier layers' rounding changed.
   Over `windows` windows of `length` tokens of the text, taken as
   mpq_llm_calibrate takes them: every window's hidden state is kept
   (windows x length x dim floats); for each layer, one pass with the layer
   in float gathers X^T X of its four inputs (position 0 included, as
   MPQ_CALIB_XTX), its seven maps are quantized by mpq_recipe_quantize(r,
   i, maps[i] with H replaced), and a second pass with the layer's maps
   dequantized gives the next layer's input. Layer 0's X^T X are therefore
   exactly the float model's (MPQ_CALIB_XTX over the same windows). Memory:
   the hidden states, one window's training scratch, X^T X of one layer's
   inputs in float64, one layer's maps dequantized (and converted, for a
   model in place), and the packed maps unless o->store takes them. Cost: two forward passes
   of the model over the windows, plus the products X^T X. Only H is
   sequential: AWQ's rows and the rest of maps[i] are the caller's (the
   float model's). */
typedef struct mpq_seq_opts {
    int windows; /* 0 -> 64 */
    int length;  /* tokens per window; 0 -> 512 */
    /* each map's X^T X as it is used (may be NULL): map i, cols x cols */
    void (*hessian)(void *user, int i, const float *H, int cols);
    /* after each layer (may be NULL) */
    void (*progress)(void *user, int layers_done, int layers, double seconds);
    /* when set, each map as soon as it is quantized: store takes *A (frees
       it; out[i] is left empty), so that the packed maps need not all be
       held; an error from it stops the run */
    mpq_status (*store)(void *user, int i, mpq_packed *A);
    void *user;
} mpq_seq_opts;

/* maps[i] for every linear map i = layer * 7 + lin of m (the model's
   shapes; H is ignored; W NULL: the model's own weights), quantized into
   out[i] (free each with mpq_packed_free), or handed to o->store. r->planner
   must be NONE (a plan made over all the maps goes in r->plan) and
   r->requant 0: MPQ_ERR_ARG. m must have float weights, in memory or in
   place (a layer is converted at a time). On an error err names the map;
   out holds nothing (what store took is the caller's). */
mpq_status mpq_llm_quantize_sequential(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_seq_opts *o,
                                       const mpq_recipe *r, const mpq_recipe_map *maps, mpq_packed *out,
                                       mpq_io_err *err);

/* The hash of a text that mpq calibrate records in its file (64-bit FNV-1a
   of the bytes), so that a file's statistics can be matched to their text. */
uint64_t mpq_text_hash(const char *s, size_t n);

/* A rotation seed as the statistics file and the tool write it: decimal
   digits only, at most 2^64 - 1. 1 and *seed set, or 0. */
int mpq_calib_parse_seed(const char *v, uint64_t *seed);

/* THE STATISTICS FILE (safetensors, F32), what `mpq quantize --stats`
   reads: for every linear map with weight name N (the model's own names),
   the tensors N.fisher, N.mixllm, N.xtx_diag, N.mean_abs, N.awq, N.xtx,
   N.pqi and N.layer_sensitivity (a scalar) that were gathered, and in
   __metadata__ "mpq_calib", a JSON object with the options, the loss and
   `extra` (may be NULL: a JSON object the caller adds, e.g. the model and
   text it came from). X^T X is written once per input, under the first
   map that reads it (q for q, k and v; gate for gate and up; o; down), as
   its lower triangle packed by rows: cols (cols + 1) / 2 floats, element
   (i, j <= i) at i (i + 1) / 2 + j (a quarter of the bytes of three full
   squares; 16 GB instead of 39 for Llama-3-8B). */
mpq_status mpq_calib_write(const mpq_llm *m, const mpq_calib_stats *s, const char *extra_json, const char *path,
                           mpq_io_err *err);
/* Calibration straight into the file mpq_calib_write would write (the same
   tensors, bit for bit; in another order): each statistic is written as
   soon as it is final (the activation statistics of a layer after the
   forward pass leaves it, the gradient statistics as the backward pass
   does), into the writer's spool on disk, so that memory holds the sums
   of one layer, not every map's results. A model in place (IN PLACE) is
   calibrated with one layer's weights converted at a time. info (may be
   NULL) receives the counts and the loss, its arrays NULL. On any error no
   file is left. */
mpq_status mpq_llm_calibrate_file(const mpq_llm *m, const int32_t *tokens, size_t n, const mpq_calib_opts *o,
                                  const char *extra_json, const char *path, mpq_calib_stats *info, mpq_io_err *err);
/* Reads a statistics file for model m back (every tensor's name, dtype,
   shape and values checked: finite, and >= 0 where a statistic cannot be
   negative). A statistic the first linear map has must be there for all
   (X^T X of k, v and up may be their input's owner's, and a full square);
   s->what has the flag of every statistic present (MPQ_CALIB_ACTS when
   any of xtx_diag, mean_abs and awq is; the arrays of the others NULL). */
mpq_status mpq_calib_read(const mpq_llm *m, const char *path, mpq_calib_stats *s, mpq_io_err *err);
/* X^T X of the linear map named `name` with `cols` inputs, from an open
   statistics or Hessian file (path names it in errors): the tensor `name`,
   else `name`.xtx, else the same two for `owner` (may be NULL: the first
   map that reads the same input, where the statistics file keeps it),
   either a cols x cols square or its packed lower triangle (THE STATISTICS
   FILE), into H (cols x cols, the triangle mirrored). Every value finite.
   MPQ_ERR_FORMAT when none is there, MPQ_ERR_SIZE for another shape,
   MPQ_ERR_NONFINITE; err names the file and tensor. */
/* The tensor mpq_calib_read_xtx would read (NULL when none is there), to
   check or prefetch it beforehand. */
const mpq_st_tensor *mpq_calib_find_xtx(mpq_st_file *f, const char *name, const char *owner);
mpq_status mpq_calib_read_xtx(mpq_st_file *f, const char *path, const char *name, const char *owner, int cols, float *H,
                              mpq_io_err *err);
/* The basis of an open statistics file's salience (ROTATED STATISTICS):
   *rotate 1 and *seed from its "mpq_calib" metadata, or *rotate 0 (also
   for a file without that metadata). MPQ_ERR_FORMAT (err names path) for
   metadata that is not JSON or a rotate_seed that is not a seed. */
mpq_status mpq_calib_file_basis(const mpq_st_file *f, const char *path, int *rotate, uint64_t *seed, mpq_io_err *err);

#ifdef __cplusplus
}
#endif

#endif /* MPQ_MODEL_H_INCLUDED */

/* mpq_tokenizer.h - byte-level BPE tokenizers, as the models mpq runs use
   them.

   Beside the header, like mpq_io: the vocabulary and merges come from GGUF
   metadata or a Hugging Face tokenizer.json, text becomes tokens and tokens
   text again. Compiled from mpq_tokenizer.c (mpq_unicode.h holds the
   Unicode classes the pre-tokenizers use); needs mpq_io (cJSON, and its
   GGUF reader). mpq_model.h includes it; so can a program that only
   tokenizes. Every fallible function returns mpq_status and, where a file
   or a text is involved, fills an optional mpq_io_err with one line naming
   it. */
#ifndef MPQ_TOKENIZER_H_INCLUDED
#define MPQ_TOKENIZER_H_INCLUDED

#include "mpq.h"
#include "mpq_io.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BYTE-LEVEL BPE. Text (UTF-8) is cut into pieces by a pre-tokenizer, each
   piece's bytes start as one token per byte (GPT-2's byte alphabet: the
   vocabulary spells byte b as a printable code point), and merges join
   neighbouring tokens, the pair of lowest rank first (leftmost among equal
   ranks), until none applies. With ignore_merges (Llama 3) a piece that is a
   token as a whole is that token. Special tokens (control tokens such as
   "<|im_start|>") are never produced by merges; their text becomes the
   token only where MPQ_TOK_SPECIAL asks for it, as llama.cpp's
   parse_special does; added tokens that are not special are always matched.

   PRE-TOKENIZERS, written out by hand (no regex engine); \p{L} letters,
   \p{N} numbers, \s white space (mpq_unicode.h):
     GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     SMOLLM  every \p{N} alone, then GPT2 on the text between (SmolLM,
             StarCoder: HF's Digits(individual) + ByteLevel)
     LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
     QWEN2   LLAMA3 with single \p{N}
   From GGUF: tokenizer.ggml.model "gpt2" and tokenizer.ggml.pre "gpt-2",
   "smollm", "llama-bpe" or "qwen2" (and a few names of the same rules).
   From tokenizer.json: model type BPE over the byte alphabet, and one of
   the pre_tokenizer shapes HF writes for these rules. A normalizer is
   refused, except NFC (Qwen2), which is applied only where it changes
   nothing: a text with code points NFC could change is MPQ_ERR_UNSUPPORTED.
   SentencePiece vocabularies (Llama 2, Mistral 7B) are MPQ_ERR_UNSUPPORTED.

   Text must be valid UTF-8 (MPQ_ERR_FORMAT names the first bad byte);
   detokenizing the tokens of a text gives the text back byte for byte. */

typedef struct mpq_tokenizer mpq_tokenizer;

typedef enum mpq_pretok {
    MPQ_PRETOK_GPT2 = 1,
    MPQ_PRETOK_SMOLLM = 2,
    MPQ_PRETOK_LLAMA3 = 3,
    MPQ_PRETOK_QWEN2 = 4
} mpq_pretok;

#define MPQ_TOK_SPECIAL      1u /* tokenize: control tokens' text in the input is that token */
#define MPQ_TOK_BOS          2u /* tokenize: begin with BOS when the vocabulary asks for it */
#define MPQ_TOK_SKIP_SPECIAL 4u /* detokenize: leave special tokens out */

/* From GGUF metadata (tokenizer.ggml.*). */
mpq_status mpq_tokenizer_from_gguf(const mpq_gguf_file *f, mpq_tokenizer **out, mpq_io_err *err);
/* From the text of a Hugging Face tokenizer.json (`origin` names it in
   messages); tokenizer_config (may be NULL) supplies add_bos_token. */
mpq_status mpq_tokenizer_from_json(const char *json, size_t len, const char *tokenizer_config, const char *origin,
                                   mpq_tokenizer **out, mpq_io_err *err);
void mpq_tokenizer_free(mpq_tokenizer *t); /* NULL is accepted */

/* Tokens in the vocabulary (the largest id + 1). */
int mpq_tokenizer_size(const mpq_tokenizer *t);
mpq_pretok mpq_tokenizer_pretok(const mpq_tokenizer *t);
/* BOS, EOS (-1 when there is none); whether tokenize adds BOS. */
int32_t mpq_tokenizer_bos(const mpq_tokenizer *t);
int32_t mpq_tokenizer_eos(const mpq_tokenizer *t);
int mpq_tokenizer_adds_bos(const mpq_tokenizer *t);
/* Whether a token ends a generation (EOS, EOT, "<|im_end|>", ...). */
int mpq_token_is_end(const mpq_tokenizer *t, int32_t id);
/* Whether a token is special (control), and its bytes (a special token's
   text); NULL for an id outside the vocabulary. */
int mpq_token_is_special(const mpq_tokenizer *t, int32_t id);
const char *mpq_token_bytes(const mpq_tokenizer *t, int32_t id, size_t *len);
/* The id of a token spelled exactly `text` in the vocabulary's own alphabet
   (byte-level form for normal tokens: "Ġthe"), or -1. */
int32_t mpq_token_find(const mpq_tokenizer *t, const char *text);

/* The pieces a pre-tokenizer cuts a text into (no special tokens, no
   vocabulary needed): *ends (malloc'ed, free it) holds the byte offset
   where each of the *n pieces ends. */
mpq_status mpq_pretokenize(mpq_pretok pre, const char *text, size_t len, size_t **ends, size_t *n, mpq_io_err *err);
/* text (len bytes of UTF-8) -> *tokens (malloc'ed, free it), *n of them. */
mpq_status mpq_tokenize(const mpq_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **tokens,
                        size_t *n, mpq_io_err *err);
/* tokens -> *text (malloc'ed, NUL-terminated, *len bytes before the NUL). */
mpq_status mpq_detokenize(const mpq_tokenizer *t, const int32_t *tokens, size_t n, unsigned flags, char **text,
                          size_t *len);
/* The tokenizer as a Hugging Face tokenizer.json, and the BOS / EOS part of
   a tokenizer_config.json (malloc'ed, free them): what mpq writes into the
   files it quantizes, so that they carry their tokenizer;
   mpq_tokenizer_from_json reads both back to the same tokens. */
mpq_status mpq_tokenizer_to_json(const mpq_tokenizer *t, char **json);
mpq_status mpq_tokenizer_config_json(const mpq_tokenizer *t, char **json);

#ifdef __cplusplus
}
#endif

#endif /* MPQ_TOKENIZER_H_INCLUDED */

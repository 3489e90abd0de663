/* A program outside the repository that uses the installed tokenizer and
   model libraries (mpq_tokenizer.h, mpq_model.h): a byte-level BPE
   vocabulary of the 256 bytes and one merge, written as a tokenizer.json,
   tokenizes "hello" and gives it back; a model that is not there is an
   error naming the file. With MPQ_CONSUMER_CUDA, the CUDA backend too: a
   backend, or the status that says why not (no GPU here). */
#define MPQ_IMPLEMENTATION
#include <mpq.h>
#include <mpq_model.h>
#ifdef MPQ_CONSUMER_CUDA
#include <mpq_cuda.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Byte b as GPT-2's byte alphabet spells it, in UTF-8: the printable bytes
   stand for themselves, the other 68 for U+0100 onwards. */
static int printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }
static void spell(int b, char *out)
{
    unsigned cp = (unsigned)b;
    if (!printable(b)) {
        cp = 0x100;
        for (int c = 0; c < b; c++) cp += !printable(c);
    }
    if (cp < 0x80)
        out[0] = (char)cp, out[1] = 0;
    else
        out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

int main(void)
{
    char *j = malloc(1 << 16), s[4];
    int k = sprintf(j, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        spell(b, s);
        k += sprintf(j + k, "%s\"%s%s\":%d", b ? "," : "", b == '"' || b == '\\' ? "\\" : "", s, b);
    }
    sprintf(j + k,
            ",\"he\":256},\"merges\":[\"h e\"]},\"pre_tokenizer\":{\"type\":\"ByteLevel\","
            "\"add_prefix_space\":false,\"use_regex\":true},\"decoder\":{\"type\":\"ByteLevel\"}}");
    mpq_tokenizer *t = NULL;
    mpq_io_err e = {0};
    if (mpq_tokenizer_from_json(j, strlen(j), NULL, "consumer", &t, &e) != MPQ_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int32_t *tok = NULL;
    size_t n = 0, len = 0;
    char *back = NULL;
    int ok = mpq_tokenize(t, "hello", 5, 0, &tok, &n, &e) == MPQ_OK && n == 4 && tok[0] == 256 &&
        mpq_detokenize(t, tok, n, 0, &back, &len) == MPQ_OK && len == 5 && !memcmp(back, "hello", 5);
    mpq_llm *m = NULL;
    ok = ok && mpq_llm_load("no-such-model.gguf", &m, &e) != MPQ_OK && strstr(e.msg, "no-such-model.gguf");
    printf("tokenizer: \"hello\" is %zu tokens and back; model: %s\n", n, e.msg);
#ifdef MPQ_CONSUMER_CUDA
    mpq_backend gpu;
    const mpq_status st = mpq_cuda_backend(0, &gpu);
    printf("CUDA backend: %s\n", st == MPQ_OK ? gpu.name : mpq_status_str(st));
    if (st == MPQ_OK) mpq_cuda_backend_destroy(&gpu);
    ok = ok && (st == MPQ_OK || st == MPQ_ERR_NODEVICE);
#endif
    free(tok), free(back), free(j);
    mpq_tokenizer_free(t);
    return ok ? 0 : 1;
}

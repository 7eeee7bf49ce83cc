/* mm3-bench-nfc: NFC of a run of 40,000 combining marks (what a hostile caption can
 * hold), the tokenizer's normalisation against HF tokenizers and against utf8proc's
 * own reordering, which is quadratic in the run.
 *
 *   mm3-bench-nfc [--commit ID] [--marks N]
 *
 * Prints one table: figure | seconds | peer | ratio | commit | date. The commit is
 * --commit, else $MM3_COMMIT, else "unknown" (scripts pass `git rev-parse --short HEAD`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "common/error.h"
#include "stage0/text/tokenizer_nfc.h"
#include "tools/bench_median.h"

/* HF tokenizers 0.23 (Python, NFC normaliser) on the same 40,000-mark text. */
#define HF_PEER_S 0.026

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 'a' then n marks alternating U+0301 (class 230) and U+0316 (class 220): every
 * pair is out of canonical order, the worst case of an insertion sort. */
static char *mark_run(size_t n, size_t *len)
{
    char *s = malloc(2 * n + 2);
    if (!s) return NULL;
    size_t k = 0;
    s[k++] = 'a';
    for (size_t i = 0; i < n; i++) {
        s[k++] = (char)0xCC;
        s[k++] = (char)(i % 2 ? 0x96 : 0x81);
    }
    s[k] = 0;
    *len = k;
    return s;
}

int main(int argc, char **argv)
{
    const char *commit = getenv("MM3_COMMIT");
    size_t marks = 40000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit = argv[++i];
        else if (!strcmp(argv[i], "--marks") && i + 1 < argc)
            marks = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: mm3-bench-nfc [--commit ID] [--marks N]\n");
            return 2;
        }
    }
    if (!commit || !commit[0]) commit = "unknown";
    size_t len;
    char *text = mark_run(marks, &len);
    if (!text || marks == 0) {
        fprintf(stderr, "mm3-bench-nfc: --marks must be > 0 (and the text must fit in memory)\n");
        return 1;
    }
    enum { REPS = 5 };
    double ours[REPS];
    for (int r = 0; r < REPS; r++) {
        char *out;
        size_t out_len;
        double t0 = now_s();
        if (tok_nfc(text, len, &out, &out_len) < 0) {
            fprintf(stderr, "mm3-bench-nfc: %s\n", mm3_last_error());
            return 1;
        }
        ours[r] = now_s() - t0;
        free(out);
    }
    double t0 = now_s();
    utf8proc_uint8_t *ref = NULL;
    utf8proc_ssize_t rn =
        utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &ref, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    double quadratic = now_s() - t0;
    free(ref);
    if (rn < 0) {
        fprintf(stderr, "mm3-bench-nfc: utf8proc_map: %s\n", utf8proc_errmsg(rn));
        return 1;
    }
    double med = bench_median(ours, REPS);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    printf("| figure | seconds | peer (HF tokenizers) | ratio to peer | commit | date |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| tok_nfc, %zu marks (median of %d) | %.4f | %.3f | %.2fx | %s | %s |\n", marks, REPS, med, HF_PEER_S,
           med / HF_PEER_S, commit, date);
    printf("| utf8proc_map (quadratic reorder), %zu marks | %.4f | %.3f | %.2fx | %s | %s |\n", marks, quadratic,
           HF_PEER_S, quadratic / HF_PEER_S, commit, date);
    free(text);
    return 0;
}

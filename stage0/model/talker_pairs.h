/* The step contract every talker backend serves (stage0/model/talker_backend.h) and the
 * CUDA frame step implements (stage0/model/cuda/frame_cuda.h): host arrays in, host
 * arrays out. Below both, so neither includes the other's header. */
#ifndef MM3_STAGE0_TALKER_PAIRS_H
#define MM3_STAGE0_TALKER_PAIRS_H

#include <stdint.h>

/* One sampling step of n CFG pairs (host arrays): what generate_sample does per
 * request with a seeded sampler and no on_draw hook, for all pairs in one call. */
struct talker_pairs_in {
    int n;                            /* pairs, 1..depth_rows / 2 */
    const float *hidden;              /* [n][2][hidden]: post-norm LM hidden of (cond, uncond) */
    const uint64_t *seed;             /* [n] sampling seeds (struct sampler.seed) */
    const int *step;                  /* [n] LM step s: draw positions n_codebooks * s + j */
    const float *cfg_scale;           /* [n] (<= 1: guidance off, as generate.c) */
    const unsigned char *ignore_stop; /* [n] nonzero: the stop column is masked before the c0 draw */
    int top_k;                        /* the c0 rule's and every draw's k (SAMPLER_TOP_K) */
};

struct talker_pairs_out {
    int32_t *codes;      /* [n][n_codebooks]: the c0 column (0 = stop, k = code k-1), then c1.. */
    float *depth_hidden; /* [n][n_codebooks - 1][hidden]: d1.. of the conditional row */
    float *feedback;     /* [n][hidden]: the frame feedback embedding (§3.7) */
    float *hidden;       /* [n][2][hidden]: the forward's LM hidden pairs (decode_pairs only) */
};

/* One decode step of n CFG pairs: the LM forward of each pair's token, then the
 * sampling step above on the hidden pairs that forward makes. */
struct talker_decode_in {
    struct talker_pairs_in pairs; /* .hidden is not read (NULL) */
    const int *row, *pos;         /* [2n]: KV row and position of pair p's (cond, uncond) token at 2p, 2p + 1 */
    const float *emb;             /* [2n][hidden]: the tokens' input embeddings */
    /* [n] nonzero: this step ends pair p's song whatever it draws (its frame budget);
     * NULL: the backend queues nothing ahead. With it the backend may start the step
     * that follows while the caller takes this one's frames (frame_cuda.h). */
    const unsigned char *last;
};

#endif

/* Render a song to a WAV file as its windows finish: the header goes out first with an
 * unknown data size, each window's samples are appended (resampled on the way when the
 * file's rate differs from the vocoder's), and the header is patched with the real size
 * at the end (a file that outgrows the 32-bit size field keeps the "unknown" marker).
 * Shared by mm3-stage1 (frames from a file) and mm3-rerender (frames recomputed by
 * teacher forcing). */
#ifndef MM3_STAGE1_RENDER_WAV_H
#define MM3_STAGE1_RENDER_WAV_H

#include <stdint.h>

#include "common/wav.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

/* Where the frames come from: feed() pushes every frame of the song into r with
 * render_push_frames (render_to_wav calls render_finish afterwards). Returns 0 or < 0. */
struct render_wav_source {
    void *ctx;
    int (*feed)(void *ctx, struct render *r);
};

struct render_wav_format {
    enum wav_format format; /* WAV_FORMAT_PCM16 or WAV_FORMAT_F32 */
    int sample_rate;        /* 0: the vocoder's own rate */
};

/* Render into the stereo WAV file `path`. p gives steps, guidance, noise and flow
 * (optional observer); its decoder and sink are replaced by the vocoder and the file.
 * frames_out (may be NULL) receives the samples per channel written. Returns 0 or < 0
 * with the message naming the file or the failing stage. */
int render_to_wav(const char *path, const struct condition_model *cm, const struct dit_model *dm,
                  const struct vocoder *voc, const struct render_params *p, const struct render_wav_source *src,
                  const struct render_wav_format *fmt, int64_t *frames_out);

#endif

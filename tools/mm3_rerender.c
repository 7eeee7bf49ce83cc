/* mm3-rerender: render a journaled song again (docs/journal.md).
 *
 *   mm3-rerender --model CKPT --journal FILE [--lora DIR[:SCALE]] [--seed N] [--steps N] [--guidance G]
 *                [--shift S] [--sample-rate 44100|32000] [--float] -o OUT.wav
 *
 * Reads the journal, rebuilds the prompt ids from its caption and lyrics (their hash
 * must match the journaled one: same tokenizer, same ids), recomputes the frames by
 * teacher forcing (stage0/teacher_force.h) and streams them into the stage-1 render
 * in-process (stage1/render.h + stage1/vocoder.h), writing the WAV as windows finish.
 * Seed, steps, guidance, shift and sample rate default to the journaled request's (a journaled
 * shift of 0: the checkpoint's scheduler shift); each can
 * be overridden. With the journal's settings the audio equals what the server sent.
 * A song made with a per-request adapter (the journal names it) needs that adapter's folder
 * and scale as the deploy file's lora_modules gave them (--lora DIR[:SCALE], scale 1 by
 * default): the frames are recomputed with it on the CPU backend, as the server made them. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli_render.h"
#include "common/error.h"
#include "common/log.h"
#include "stage0/model/talker_backend.h"
#include "stage0/model/talker_lora.h"
#include "stage0/recovery/journal.h"
#include "stage0/teacher_force.h"
#include "stage0/text/generate_prompt.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/render.h"
#include "stage1/render_wav.h"
#include "stage1/vocoder.h"

struct options {
    const char *model, *journal, *out;
    const char *lora_dir; /* --lora DIR[:SCALE], NULL: none */
    double lora_scale;
    struct cli_render render; /* a knob not given: the journaled request's */
    int sample_rate;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-rerender --model CKPT --journal FILE [--lora DIR[:SCALE]] [--seed N] [--steps N]\n"
               "                    [--guidance G] [--shift S] [--sample-rate 44100|32000] [--float] -o OUT.wav\n");
}

struct stage0_models {
    struct talker lm;
    struct depth dd;
    int loaded;
};

/* Frames recomputed by teacher forcing, streamed into the render as they come. */
struct rerender_feed {
    struct render *r;
    int width; /* n_codebooks * hidden: the layout stage 1 takes */
    const struct stage0_models *s0;
    const int32_t *ids;
    int P;
    const struct journal_record *rec;
    const struct talker_lora_set *lora; /* the song's adapter (slot 0), or NULL */
};

static int push_to_render(void *ctx, int t0, const float *frames, int n)
{
    (void)t0;
    struct rerender_feed *f = ctx;
    int rc = render_push_frames(f->r, frames, n, f->width);
    return rc < 0 ? rc : 0;
}

static int rerender_feed_run(void *ctx, struct render *r)
{
    struct rerender_feed *f = ctx;
    f->r = r;
    struct teacher_force_sink sink = {f, push_to_render};
    if (!f->lora)
        return teacher_force_stream(&f->s0->lm, &f->s0->dd, f->ids, f->P, f->rec->codes, f->rec->n_steps, &sink);
    /* one row on the CPU backend, its adapter as the server applied it */
    struct talker_backend be;
    int rc = talker_backend_open(&be, TALKER_BACKEND_CPU, &f->s0->lm, &f->s0->dd, 1, f->P + f->rec->n_steps,
                                 TEACHER_FORCE_CHUNK);
    if (rc < 0) return rc;
    if ((rc = talker_backend_set_lora(&be, f->lora)) == 0 && (rc = talker_backend_row_lora(&be, 0, 0)) == 0)
        rc = teacher_force_stream_backend(&be, 0, f->ids, f->P, f->rec->codes, f->rec->n_steps, &sink);
    talker_backend_close(&be);
    return rc;
}

/* The prompt of the journal, checked against its hash. */
static int journal_prompt(const char *model, const struct journal_record *rec, int32_t **ids, int *P)
{
    int n, rc = generate_prompt_ids(model, rec->h.params.caption, rec->h.params.lyrics, ids, &n);
    if (rc < 0) return rc;
    *P = n / 2;
    if (*P != rec->h.prompt_len || journal_prompt_hash(*ids, *P) != rec->h.prompt_hash) {
        free(*ids);
        *ids = NULL;
        return mm3_errorf(-EINVAL,
                          "the prompt tokenizes to %d ids per row here, the journal's to %d with another hash: "
                          "not the tokenizer the song was made with",
                          *P, rec->h.prompt_len);
    }
    return 0;
}

static int rerender(const struct options *o)
{
    struct journal_record rec;
    struct stage0_models s0 = {0};
    struct condition_model *cm = NULL;
    struct dit_model *dm = NULL;
    struct vocoder *voc = NULL;
    struct talker_lora_set lora = {0};
    int32_t *ids = NULL;
    int P, rc;
    if ((rc = journal_read(o->journal, &rec)) < 0) return rc;
    const struct mm3_job_params *jp = &rec.h.params;
    if (rec.torn) LOG_WARN("%s: torn tail ignored: %d steps kept", o->journal, rec.n_steps);
    if (rec.status != JOURNAL_DONE)
        LOG_WARN("%s: the song's journal says '%s'; rendering the %d frames it holds", o->journal,
                 journal_status_name(rec.status), rec.n_steps > 0 ? rec.n_steps - 1 : 0);
    if (rec.n_steps < 2) {
        rc = mm3_errorf(-ENODATA, "%s: no frame journaled (%d steps)", o->journal, rec.n_steps);
        goto out;
    }
    /* its frames came from the adapter's talker; the base model's would be another song */
    if (jp->lora[0] && !o->lora_dir) {
        rc = mm3_errorf(-EINVAL,
                        "%s: the song was made with the per-request adapter '%s': give its folder and scale with "
                        "--lora DIR[:SCALE] (the deploy file's lora_modules entry '%s')",
                        o->journal, jp->lora, jp->lora);
        goto out;
    }
    if (!jp->lora[0] && o->lora_dir) {
        rc = mm3_errorf(-EINVAL, "%s: the song was made without an adapter; --lora %s would render another song",
                        o->journal, o->lora_dir);
        goto out;
    }
    if ((rc = journal_prompt(o->model, &rec, &ids, &P)) < 0) goto out;
    if ((rc = talker_load(&s0.lm, o->model)) < 0) goto out;
    if ((rc = depth_load(&s0.dd, o->model)) < 0) {
        talker_free(&s0.lm);
        goto out;
    }
    s0.loaded = 1;
    if (s0.dd.cfg.n_codebooks != rec.h.n_codebooks) {
        rc = mm3_errorf(-EINVAL, "%s: %d codebooks per step, the checkpoint's depth decoder has %d", o->journal,
                        rec.h.n_codebooks, s0.dd.cfg.n_codebooks);
        goto out;
    }
    if ((rc = condition_load(&cm, o->model)) < 0 || (rc = dit_load(&dm, o->model)) < 0 ||
        (rc = vocoder_load(&voc, o->model)) < 0)
        goto out;
    int native = vocoder_sample_rate(voc);
    int rate = o->sample_rate ? o->sample_rate : jp->sample_rate == 32000 ? 32000 : native;
    float shift = o->render.shift_given ? o->render.shift : jp->flow_shift;
    if (!(shift > 0.0f) && (rc = flow_checkpoint_shift(o->model, &shift)) < 0) goto out;
    struct render_params p = {
        .n_steps = o->render.steps_given         ? o->render.steps
                   : jp->num_inference_steps > 0 ? jp->num_inference_steps
                                                 : FLOW_DEFAULT_STEPS,
        .guidance = o->render.guidance_given ? o->render.guidance : jp->guidance_scale,
        .shift = shift,
        .noise = {RENDER_NOISE_SEEDED, o->render.seed_given ? o->render.seed : jp->seed, 0, NULL, NULL},
    };
    LOG_INFO("%s: request %s, %d frames, seed %" PRIu64 ", %d steps, guidance %.3g, shift %g, %d Hz", o->journal,
             rec.h.request_id, rec.n_steps - 1, p.noise.seed, p.n_steps, (double)p.guidance, (double)p.shift, rate);
    if (o->lora_dir && (rc = talker_lora_set_add(&lora, &s0.lm.cfg, jp->lora, o->lora_dir, o->lora_scale)) < 0) {
        mm3_error_prefix(rc, "--lora: ");
        goto out;
    }
    struct rerender_feed feed = {
        NULL, s0.dd.cfg.n_codebooks * s0.lm.cfg.hidden, &s0, ids, P, &rec, o->lora_dir ? &lora : NULL};
    struct render_wav_source src = {&feed, rerender_feed_run};
    struct render_wav_format fmt = {o->render.as_float ? WAV_FORMAT_F32 : WAV_FORMAT_PCM16, rate};
    rc = render_to_wav(o->out, cm, dm, voc, &p, &src, &fmt, NULL);
out:
    talker_lora_set_free(&lora);
    condition_free(cm);
    dit_free(dm);
    vocoder_free(voc);
    if (s0.loaded) {
        talker_free(&s0.lm);
        depth_free(&s0.dd);
    }
    free(ids);
    journal_record_free(&rec);
    return rc;
}

/* --lora DIR[:SCALE]: the scale a number in -100..100 (the deploy key's range) after the last ':'. */
static int lora_option(char *arg, struct options *o)
{
    o->lora_dir = arg;
    o->lora_scale = 1.0;
    char *colon = strrchr(arg, ':');
    if (!colon) return 0;
    char *end;
    errno = 0;
    double v = strtod(colon + 1, &end);
    if (end == colon + 1 || *end || errno || !(v >= -100 && v <= 100))
        return mm3_errorf(-EINVAL, "--lora '%s': expected DIR or DIR:SCALE with SCALE a number in -100..100", arg);
    *colon = 0;
    o->lora_scale = v;
    return 0;
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("rerender");
    struct options o = {0};
    /* clang-format off */
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"journal", required_argument, NULL, 'j'},
        CLI_RENDER_LONGOPTS,
        {"sample-rate", required_argument, NULL, 'r'},
        {"lora", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* clang-format on */
    int c;
    uint64_t v;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        int taken = cli_render_option(&o.render, c, optarg);
        if (taken < 0) {
            fprintf(stderr, "mm3-rerender: %s\n", mm3_last_error());
            return 2;
        }
        if (taken) continue;
        switch (c) {
        case 'm':
            o.model = optarg;
            break;
        case 'j':
            o.journal = optarg;
            break;
        case 'o':
            o.out = optarg;
            break;
        case 'r':
            if (cli_u64_parse(optarg, &v) < 0 || (v != 44100 && v != 32000)) {
                fprintf(stderr, "mm3-rerender: --sample-rate '%s': expected 44100 or 32000\n", optarg);
                return 2;
            }
            o.sample_rate = (int)v;
            break;
        case 'l':
            if (lora_option(optarg, &o) < 0) {
                fprintf(stderr, "mm3-rerender: %s\n", mm3_last_error());
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc || !o.model || !o.journal || !o.out) {
        usage(stderr);
        return 2;
    }
    if (rerender(&o) < 0) {
        fprintf(stderr, "mm3-rerender: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
}

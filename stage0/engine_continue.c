/* continue_from (stage0/engine_internal.h): a finished song kept in the song store goes
 * on in a new request. Stage 0 teacher-forces the song's steps onto the request's rows
 * and sends their frames again, so stage 1 renders the whole song with its windows
 * chained from the start (the simplest correct join: its cost is stage 1 rendering the
 * earlier part again); the PCM of the earlier part is skipped unless the request asks
 * for the whole song (docs/api.md, "Continuing a song"). continue_journal brings the
 * song as an uploaded journal file instead, checked like any request body. */
#include "stage0/engine_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/recovery/journal.h"

/* 400 naming field when the request set it (bit) to something other than the song's. */
static int conflict(struct mm3_job *job, uint32_t bit, int differs, const char *field, const char *song_value)
{
    if (!(job->params.given & bit) || !differs) return 0;
    mm3_job_set_error_param(job, 400, field,
                            "%s: differs from the continued song's (%s); leave it out, a continuation keeps its "
                            "song's %s",
                            field, song_value, field);
    return -EINVAL;
}

/* The fields that shape the song (its text, its draws, its rendering) must be the song's. */
static int check_conflicts(struct mm3_job *job, const struct mm3_job_params *song)
{
    const struct mm3_job_params *p = &job->params;
    char v[64];
    int rc = conflict(job, MM3_GIVEN_LYRICS, strcmp(p->lyrics, song->lyrics) != 0, "input", "its lyrics");
    if (rc == 0) rc = conflict(job, MM3_GIVEN_CAPTION, strcmp(p->caption, song->caption) != 0, "instructions",
                               "its caption");
    snprintf(v, sizeof v, "%llu", (unsigned long long)song->seed);
    if (rc == 0) rc = conflict(job, MM3_GIVEN_SEED, p->seed != song->seed, "seed", v);
    snprintf(v, sizeof v, "%g", song->cfg_scale);
    if (rc == 0) rc = conflict(job, MM3_GIVEN_CFG_SCALE, p->cfg_scale != song->cfg_scale, "cfg_scale", v);
    snprintf(v, sizeof v, "%d", song->num_inference_steps);
    if (rc == 0)
        rc = conflict(job, MM3_GIVEN_STEPS, p->num_inference_steps != song->num_inference_steps,
                      "num_inference_steps", v);
    snprintf(v, sizeof v, "%g", song->guidance_scale);
    if (rc == 0)
        rc = conflict(job, MM3_GIVEN_GUIDANCE, p->guidance_scale != song->guidance_scale, "guidance_scale", v);
    snprintf(v, sizeof v, "%g", song->flow_shift);
    if (rc == 0) rc = conflict(job, MM3_GIVEN_FLOW_SHIFT, p->flow_shift != song->flow_shift, "flow_shift", v);
    /* the song's frames came from its adapter's talker: the rest must too */
    snprintf(v, sizeof v, "%s", song->lora[0] ? song->lora : "no adapter");
    if (rc == 0) rc = conflict(job, MM3_GIVEN_LORA, strcmp(p->lora, song->lora) != 0, "lora", v);
    return rc;
}

/* The job's params become the song's, with the whole song's length: new frames after
 * the song's `frames`, at least one (the new part never ends before its first frame). */
static int take_song(struct engine *e, struct mm3_job *job, const struct song_record *rec, const char *field)
{
    struct mm3_job_params *p = &job->params;
    int frames = rec->n_steps - 1, room = e->max_song_frames - frames;
    if (room < 1) {
        mm3_job_set_error_param(job, 400, field, "%s: the song has %d frames (%.2f s), the longest a song can be",
                                field, frames, frames / e->fps);
        return -EINVAL;
    }
    int add = p->max_frames;
    if (add > room) {
        if (p->given & MM3_GIVEN_LENGTH) {
            mm3_job_set_error_param(job, 400, "duration_s",
                                    "duration_s (or max_new_tokens): %d new frames (%.2f s) after the song's %d would "
                                    "pass the longest song of %d frames; at most %d (%.2f s) can be added",
                                    add, add / e->fps, frames, e->max_song_frames, room, room / e->fps);
            return -EINVAL;
        }
        add = room; /* the default length: what is left */
    }
    char *caption = strdup(rec->params.caption), *lyrics = strdup(rec->params.lyrics);
    if (!caption || !lyrics) {
        free(caption), free(lyrics);
        return mm3_errorf(-ENOMEM, "continue_from: out of memory");
    }
    free(p->caption), free(p->lyrics);
    p->caption = caption;
    p->lyrics = lyrics;
    p->seed = rec->params.seed;
    p->cfg_scale = rec->params.cfg_scale;
    p->num_inference_steps = rec->params.num_inference_steps;
    p->guidance_scale = rec->params.guidance_scale;
    p->flow_shift = rec->params.flow_shift;
    memcpy(p->lora, rec->params.lora, sizeof p->lora);
    p->max_frames = frames + add;
    p->min_frames = frames + (p->min_frames > 1 ? p->min_frames : 1);
    if (p->min_frames > p->max_frames) p->min_frames = p->max_frames;
    /* the earlier part's audio: its frames' time at stage 1's rate */
    job->pcm_skip = p->return_whole ? 0 : (int64_t)llround((double)frames * job->pcm_rate / e->fps);
    return 0;
}

/* 400 about the uploaded journal (continue_journal). */
static int bad_journal(struct mm3_job *job, const char *msg)
{
    mm3_job_set_error_param(job, 400, "continue_journal", "continue_journal: %s", msg);
    return -EINVAL;
}

/* The song of an uploaded journal (untrusted): an intact journal of a finished song of
 * this model, at most the longest song, its parameters within the request ranges (they
 * reach stage 1 as a request's would; the caption and lyrics meet the prompt's checks in
 * the scheduler); *prompt_hash for the scheduler to check. */
static int uploaded_song(struct engine *e, struct mm3_job *job, struct song_record *out, uint64_t *prompt_hash)
{
    const struct mm3_job_params *p = &job->params;
    memset(out, 0, sizeof *out);
    struct journal_record jr;
    int rc = journal_read_buffer("(uploaded)", p->journal, p->journal_len, e->max_song_frames + 1, &jr);
    if (rc == -EINVAL) return bad_journal(job, mm3_last_error());
    if (rc < 0) return rc;
    char msg[256];
    if (jr.h.n_codebooks != e->n_codebooks || jr.h.audio_vocab != e->audio_vocab || jr.h.c0_codes != SAMPLER_N_CODES)
        snprintf(msg, sizeof msg,
                 "written for another model (%d codebooks, %d semantic and %d audio codes; this server's: %d, %d "
                 "and %d)",
                 jr.h.n_codebooks, jr.h.c0_codes, jr.h.audio_vocab, e->n_codebooks, SAMPLER_N_CODES, e->audio_vocab);
    else if (jr.torn)
        snprintf(msg, sizeof msg,
                 "the file is cut or corrupt after %d steps (byte %lld of %zu), or longer than %d frames: upload the "
                 "whole journal of a finished song",
                 jr.n_steps, (long long)jr.valid_bytes, p->journal_len, e->max_song_frames);
    else if (jr.h.params.num_inference_steps < 1 || jr.h.params.num_inference_steps > 200)
        snprintf(msg, sizeof msg, "header field 'num_inference_steps' is %d, expected 1..200",
                 jr.h.params.num_inference_steps);
    else if (!(jr.h.params.guidance_scale >= 0 && jr.h.params.guidance_scale <= 100))
        snprintf(msg, sizeof msg, "header field 'guidance_scale' is %g, expected 0..100", jr.h.params.guidance_scale);
    else if (!(jr.h.params.cfg_scale >= 0 && jr.h.params.cfg_scale <= 100))
        snprintf(msg, sizeof msg, "header field 'cfg_scale' is %g, expected 0..100", jr.h.params.cfg_scale);
    else if (jr.h.params.seed > INT64_MAX)
        snprintf(msg, sizeof msg, "header field 'seed' is %llu, expected 0..%lld",
                 (unsigned long long)jr.h.params.seed, (long long)INT64_MAX);
    else if (jr.status != JOURNAL_DONE)
        snprintf(msg, sizeof msg, "the journal's song is %s, not done: only a delivered song can be continued",
                 journal_status_name(jr.status));
    else
        msg[0] = 0;
    if (msg[0]) {
        journal_record_free(&jr);
        return bad_journal(job, msg);
    }
    /* the record's strings and codes move into the song */
    out->params = jr.h.params;
    out->params.replay_file = NULL;
    out->params.journal = NULL;
    jr.h.params.caption = jr.h.params.lyrics = NULL;
    out->codes = jr.codes;
    jr.codes = NULL;
    out->n_steps = jr.n_steps;
    out->n_codebooks = jr.h.n_codebooks;
    *prompt_hash = jr.h.prompt_hash;
    journal_record_free(&jr);
    return 0;
}

/* The song a continuation names: kept by this server, or uploaded. */
static int find_song(struct engine *e, struct mm3_job *job, struct song_record *rec, uint64_t *prompt_hash)
{
    struct mm3_job_params *p = &job->params;
    *prompt_hash = 0;
    if (p->journal) return uploaded_song(e, job, rec, prompt_hash);
    if (!e->songs) {
        mm3_job_set_error_param(job, 400, "continue_from",
                                "continue_from: continuing songs is off on this server (api.continue_max_songs: 0); "
                                "continue_journal takes the song's journal file instead");
        return -EINVAL;
    }
    int rc = song_store_get(e->songs, p->continue_from, mm3_job_now_ns(), rec);
    if (rc == -ENOENT) {
        mm3_job_set_error_param(job, 404, "continue_from",
                                "continue_from: no finished song %s on this server (unknown, failed or cancelled, or "
                                "no longer kept: api.continue_max_songs / continue_max_bytes / continue_max_age_s; "
                                "a restart forgets every song)",
                                p->continue_from);
        return -EINVAL;
    }
    return rc;
}

int eng_continue_submit(struct engine *e, struct mm3_job *job)
{
    struct mm3_job_params *p = &job->params;
    const char *field = p->journal ? "continue_journal" : "continue_from";
    if (p->replay_file) {
        mm3_job_set_error_param(job, 400, "x_replay_file", "x_replay_file: cannot be combined with %s", field);
        return -EINVAL;
    }
    struct song_record rec;
    uint64_t prompt_hash;
    int rc = find_song(e, job, &rec, &prompt_hash);
    if (rc < 0) return rc;
    if (rec.n_steps < 2) {
        mm3_job_set_error_param(job, 400, field, "%s: the song has no frame to continue", field);
        rc = -EINVAL;
    }
    if (rc == 0) rc = check_conflicts(job, &rec.params);
    if (rc == 0) rc = take_song(e, job, &rec, field);
    if (rc == 0) {
        rc = sched_submit_continue(e->sched, job, rec.codes, rec.n_steps, prompt_hash);
        if (rc == 0)
            LOG_INFO("job %llu: continues %s (%d frames) to %d frames, answering %s", (unsigned long long)job->id,
                     p->journal ? "an uploaded journal's song" : p->continue_from, rec.n_steps - 1, p->max_frames,
                     p->return_whole ? "the whole song" : "the new part");
    }
    song_record_free(&rec);
    return rc;
}

void eng_continue_keep(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    int32_t *codes = r->codes;
    int n_steps = r->n_steps, ncb = r->n_codebooks;
    r->codes = NULL;
    pthread_mutex_unlock(&e->mu);
    if (!e->songs || !codes) return;
    if (!mm3_job_is_terminal(r->job) && !atomic_load(&r->job->cancel_requested) &&
        song_store_put(e->songs, r->job->public_id, &r->job->params, codes, n_steps, ncb, mm3_job_now_ns()) < 0)
        LOG_WARN("job %llu: not kept for continuation: %s", (unsigned long long)r->job->id, mm3_last_error());
    free(codes);
}

/* test_concurrency.c - one model, several states, several threads stepping
 * at once give bit for bit what sequential runs give.
 *
 * For every host backend this build can run (the reference, and the CPU
 * backend once it is available: hd_backend_available decides, so a new
 * backend is covered without editing this file): one model of pattern "KM",
 * E 8; N_STATES states, each with its own prefilled cache and inputs; first
 * every state runs its steps alone, one after the other, then fresh states
 * run the same steps in N_STATES threads started together.  Outputs and the
 * final states (every tensor exported) must be identical.  At the small
 * size (tu_small: valgrind) 2 states take 1 step each.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define D HD_HIDDEN
#define N_STATES 4 /* at most; n_states() */
#define N_STEPS 2  /* at most; n_steps() */
#define CAPACITY 8

static int n_states(void)
{
    return tu_size(N_STATES, 2);
}

static int n_steps(void)
{
    return tu_size(N_STEPS, 1);
}

typedef struct job {
    const hd_model *model;
    hd_state *state;
    int id;
    pthread_barrier_t *start;
    int steps;
    uint16_t out[N_STEPS][D];
    hd_status status;
} job;

/* State `id` starts with id + 1 prefilled rows (seed 20 + id) and steps
 * inputs of seed 30 + id. */
static hd_state *job_state(const hd_model *model, int id)
{
    hd_state *s = tu_state_new(model, CAPACITY);
    size_t rows = (size_t)id + 1;
    int n_mla = tu_n_mla(model);
    uint16_t *ckv = tu_xmalloc((size_t)n_mla * rows * HD_MLA_KV_LORA * 2);
    uint16_t *kr = tu_xmalloc((size_t)n_mla * rows * HD_MLA_QK_ROPE * 2);
    for (int l = 0; l < n_mla; l++)
        ck_assert_int_eq(hd_synth_cache(20 + (uint32_t)id + 7 * (uint32_t)l, rows,
                                        ckv + (size_t)l * rows * HD_MLA_KV_LORA,
                                        kr + (size_t)l * rows * HD_MLA_QK_ROPE),
                         HD_OK);
    ck_assert_int_eq(hd_state_prefill(s, rows, ckv, kr), HD_OK);
    free(ckv);
    free(kr);
    return s;
}

static void *job_run(void *arg)
{
    job *j = arg;
    uint16_t in[D];
    if (j->start)
        pthread_barrier_wait(j->start);
    j->status = HD_OK;
    for (int k = 0; k < j->steps && j->status == HD_OK; k++) {
        /* No Check assertions here: they are not thread-safe. */
        j->status = hd_synth_input(30 + (uint32_t)j->id, (uint64_t)k, in);
        if (j->status == HD_OK)
            j->status = hd_step(j->model, j->state, in, j->out[k]);
    }
    return NULL;
}

static void run_backend(hd_backend backend)
{
    char err[256] = "";
    if (hd_backend_available(backend, err, sizeof err) != HD_OK) {
        printf("backend %s: not available here (%s), skipped\n",
               hd_backend_name(backend), err);
        return;
    }
    hd_options opt;
    hd_options_init(&opt);
    opt.backend = backend;
    opt.threads = 2; /* CPU backend: threads inside threads, kept small */
    hd_model *model = NULL;
    hd_status st = hd_model_synth(11, 8, "KM", &opt, &model, err, sizeof err);
    ck_assert_msg(st == HD_OK, "hd_model_synth(%s): %s",
                  hd_backend_name(backend), err);

    static job seq[N_STATES], par[N_STATES];
    tu_snapshot *seq_snap[N_STATES];
    const int ns = n_states(), steps = n_steps();

    /* Sequential. */
    for (int i = 0; i < ns; i++) {
        memset(&seq[i], 0, sizeof seq[i]);
        seq[i].model = model;
        seq[i].id = i;
        seq[i].steps = steps;
        seq[i].state = job_state(model, i);
        job_run(&seq[i]);
        ck_assert_int_eq(seq[i].status, HD_OK);
        seq_snap[i] = tu_snapshot_take(model, seq[i].state);
        hd_state_free(seq[i].state);
    }

    /* Concurrent: all threads released together. */
    pthread_t threads[N_STATES];
    pthread_barrier_t start;
    ck_assert_int_eq(pthread_barrier_init(&start, NULL, (unsigned)ns), 0);
    for (int i = 0; i < ns; i++) {
        memset(&par[i], 0, sizeof par[i]);
        par[i].model = model;
        par[i].id = i;
        par[i].steps = steps;
        par[i].state = job_state(model, i);
        par[i].start = &start;
    }
    for (int i = 0; i < ns; i++)
        ck_assert_int_eq(pthread_create(&threads[i], NULL, job_run, &par[i]), 0);
    for (int i = 0; i < ns; i++)
        ck_assert_int_eq(pthread_join(threads[i], NULL), 0);
    pthread_barrier_destroy(&start);

    for (int i = 0; i < ns; i++) {
        ck_assert_msg(par[i].status == HD_OK, "%s: thread %d: step = %d",
                      hd_backend_name(backend), i, (int)par[i].status);
        for (int k = 0; k < steps; k++)
            ck_assert_msg(memcmp(par[i].out[k], seq[i].out[k], sizeof(uint16_t) * D) == 0,
                          "%s: thread %d step %d differs from the sequential run",
                          hd_backend_name(backend), i, k);
        tu_snapshot *snap = tu_snapshot_take(model, par[i].state);
        ck_assert_msg(tu_snapshot_equal(snap, seq_snap[i]),
                      "%s: state %d differs from the sequential run",
                      hd_backend_name(backend), i);
        tu_snapshot_free(snap);
        tu_snapshot_free(seq_snap[i]);
        hd_state_free(par[i].state);
    }
    /* The states differ from each other (the test is not vacuous). */
    ck_assert(memcmp(seq[0].out[0], seq[1].out[0], sizeof(uint16_t) * D) != 0);
    printf("backend %s: %d threads x %d steps identical to sequential\n",
           hd_backend_name(backend), ns, steps);
    hd_model_free(model);
}

START_TEST(test_threads_match_sequential)
{
    static const hd_backend backends[] = {HD_BACKEND_REF, HD_BACKEND_CPU};
    run_backend(backends[_i]);
}
END_TEST

static Suite *concurrency_suite(void)
{
    Suite *s = suite_create("concurrency");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, TU_TIMEOUT);
    tcase_add_loop_test(tc, test_threads_match_sequential, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tu_run_suite(concurrency_suite());
}

/*
 * prefetch_feedback.c - feedback-directed prefetch admission (prefetch_feedback.h).
 */
#include "prefetch_feedback.h"

#include <stdlib.h>
#include <string.h>

#include "fmoe/error.h"

int fmoe__prefetch_feedback_init(prefetch_feedback *f, int32_t L, int32_t J) {
    memset(f, 0, sizeof *f);
    f->L = L;
    f->J = J;
    const size_t LJ = (size_t)L * (size_t)J;
    f->predicted = malloc(LJ);
    f->made = calloc((size_t)L, sizeof *f->made);
    f->victim = calloc(LJ, 1);
    f->right = calloc((size_t)L * FEEDBACK_RANKS, sizeof *f->right);
    f->scored = calloc((size_t)L * FEEDBACK_RANKS, sizeof *f->scored);
    f->chosen = calloc((size_t)J, 1);
    if (!f->predicted || !f->made || !f->victim || !f->right || !f->scored || !f->chosen) {
        fmoe__prefetch_feedback_free(f);
        return fmoe_error_set(FMOE_ENOMEM, "prefetch feedback for %d x %d experts", L, J);
    }
    memset(f->predicted, -1, LJ);
    return 0;
}

void fmoe__prefetch_feedback_free(prefetch_feedback *f) {
    free(f->predicted);
    free(f->made);
    free(f->victim);
    free(f->right);
    free(f->scored);
    free(f->chosen);
    memset(f, 0, sizeof *f);
}

int32_t fmoe__prefetch_feedback_predict(prefetch_feedback *f, int32_t l, int32_t j) {
    int8_t *p = &f->predicted[(size_t)l * f->J + j];
    if (*p < 0) {
        const int32_t r = f->made[l] < FEEDBACK_RANKS - 1 ? f->made[l] : FEEDBACK_RANKS - 1;
        *p = (int8_t)r;
        f->made[l]++;
    }
    return *p;
}

/* (k + 1) / (n + 2) */
static double laplace(double k, double n) { return (k + 1) / (n + 2); }

double fmoe__prefetch_feedback_accuracy(const prefetch_feedback *f, int32_t l, int32_t rank) {
    const size_t i = (size_t)l * FEEDBACK_RANKS + (size_t)rank;
    return laplace(f->right[i], f->scored[i]);
}

double fmoe__prefetch_feedback_regret(const prefetch_feedback *f) {
    return laplace(f->regrets, f->evictions);
}

/* a (1 - u) - (1 - a) u - r > 0, i.e. a > u + r (prefetch_feedback.h) */
int fmoe__prefetch_feedback_admit(const prefetch_feedback *f, int32_t l, int32_t rank) {
    const double a = fmoe__prefetch_feedback_accuracy(f, l, rank);
    return a - f->link_use - fmoe__prefetch_feedback_regret(f) > 0;
}

/* The busy time and the elapsed time are averaged apart and divided, so u is a share of
 * time: averaging each interval's own share would weigh the short interval between two
 * hits like the long one that holds a miss's transfer, and decode's misses come in such
 * bursts (a cache hitting 90% of accesses measured u = 0.1 on a link busy half the time). */
void fmoe__prefetch_feedback_link(prefetch_feedback *f, double busy_s, double now) {
    const double dt = now - f->last_now;
    if (dt > 0) {
        const double w = 1.0 / (f->L + 1); /* about one iteration of gates */
        f->busy_avg += w * ((busy_s - f->last_busy_s) - f->busy_avg);
        f->time_avg += w * (dt - f->time_avg);
        const double u = f->busy_avg / f->time_avg;
        f->link_use = u < 0 ? 0 : u > 1 ? 1 : u;
    }
    f->last_busy_s = busy_s;
    f->last_now = now;
}

void fmoe__prefetch_feedback_evicted(prefetch_feedback *f, int32_t e) { f->victim[e] = 1; }

void fmoe__prefetch_feedback_gate(prefetch_feedback *f, int32_t l, const int32_t *distinct, int32_t n) {
    const int32_t J = f->J;
    for (int32_t q = 0; q < n; q++) f->chosen[distinct[q]] = 1;
    int8_t *pred = f->predicted + (size_t)l * J;
    uint8_t *vic = f->victim + (size_t)l * J;
    double *right = f->right + (size_t)l * FEEDBACK_RANKS;
    double *scored = f->scored + (size_t)l * FEEDBACK_RANKS;
    for (int32_t j = 0; j < J; j++) {
        if (pred[j] >= 0) {
            const int32_t r = pred[j];
            right[r] += f->chosen[j];
            if (++scored[r] >= FEEDBACK_WINDOW) {
                right[r] /= 2;
                scored[r] /= 2;
            }
            pred[j] = -1;
        }
        if (vic[j]) {
            f->regrets += f->chosen[j];
            if (++f->evictions >= FEEDBACK_WINDOW) {
                f->regrets /= 2;
                f->evictions /= 2;
            }
            vic[j] = 0;
        }
    }
    f->made[l] = 0;
    for (int32_t q = 0; q < n; q++) f->chosen[distinct[q]] = 0;
}

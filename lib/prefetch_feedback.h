/*
 * prefetch_feedback.h - feedback-directed prefetch admission, internal to lib/slots.c
 * (Srinath et al., "Feedback Directed Prefetching", HPCA 2007, adapted to expert caches),
 * so that a prefetching policy does not lose to LRU when its predictions are poor.
 *
 * A prefetch pays for itself when the expert it brings is used before it goes, and costs
 * when the expert it evicts is needed again. Both are measured, per run, at the gates:
 *
 *   accuracy a(l, r): of the policy's predictions for MoE layer l of experts not
 *                     resident when predicted that were the r-th such prediction for that
 *                     layer in their cycle (r = 0 the first, capped), the share whose
 *                     expert the gate of layer l chose; scored whether or not the
 *                     prediction was admitted (a shadow prediction), so a layer that
 *                     stopped prefetching resumes as soon as its predictions turn right.
 *                     Predictions of resident experts are left out: they cost and save
 *                     nothing, and where LRU already hits most accesses they are the easy,
 *                     right ones that would make the wrong transfers look worth it;
 *   regret r:         of the experts evicted to make room (for a prefetch or a demand
 *                     load), the share that the next gate of their layer chose again:
 *                     what evicting the policy's victim costs, in misses per eviction.
 *
 *   link use u:       the share of time the copy engine was busy over the last gates (the
 *                     executor's figure; busy and elapsed time averaged apart, so that a
 *                     burst of transfers weighs by its length), the chance that a wasted
 *                     transfer delays one that was needed.
 *
 * A prediction becomes a prefetch when a free slot takes it, or when, in units of one
 * transfer, what it saves exceeds what it costs:
 *     a (1 - u)  -  (1 - a) u  -  regret  > 0,   that is   a > u + regret.
 * Right (a), its transfer saves a stall only if it finds idle link time to hide in,
 * which it does with chance 1 - u: on a saturated link a right prefetch only changes which
 * transfer waits, as the bytes still have to cross. Wrong (1 - a), it holds the link when a
 * needed transfer may come, with chance u. Its eviction costs the regret either way. (An
 * earlier rule credited a right prefetch with a whole transfer whatever the link's load,
 * a - regret - (1 - a) u > 0; where the link is the bottleneck, as in decode of a model
 * whose cache already hits most accesses, it admitted prefetches that were right 60% of
 * the time and still lost time to LRU: fmoe-tiny, 25% of the experts cached, 1.03x.)
 * The two rates are
 * Laplace estimates ((k + 1) / (n + 2): no evidence gives 1/2 against 1/2, so nothing is
 * admitted on faith) over a sliding horizon: counts are halved when they reach
 * FEEDBACK_WINDOW, so the estimates follow a workload that changes.
 */
#ifndef FMOE_PREFETCH_FEEDBACK_H
#define FMOE_PREFETCH_FEEDBACK_H

#include <stdint.h>

enum { FEEDBACK_RANKS = 8, FEEDBACK_WINDOW = 128 };

typedef struct prefetch_feedback {
    int32_t L, J;
    int8_t *predicted;        /* [L][J] rank of a pending prediction, -1 none */
    int32_t *made;            /* [L] predictions made for layer l this cycle */
    uint8_t *victim;          /* [L][J] evicted since layer l's last gate */
    double *right, *scored;   /* [L][RANKS] */
    double regrets, evictions;
    double link_use;          /* u = busy_avg / time_avg */
    double busy_avg, time_avg; /* busy and elapsed time between gates, averaged over ~L gates */
    double last_busy_s, last_now;
    uint8_t *chosen;          /* [J] scratch: the gate's experts */
} prefetch_feedback;

int fmoe__prefetch_feedback_init(prefetch_feedback *f, int32_t L, int32_t J);
void fmoe__prefetch_feedback_free(prefetch_feedback *f);

/* A prediction of expert j for layer l: its rank in layer l's cycle (recorded once). */
int32_t fmoe__prefetch_feedback_predict(prefetch_feedback *f, int32_t l, int32_t j);

/* Whether a prediction of rank `rank` for layer l may evict an expert to come in. */
int fmoe__prefetch_feedback_admit(const prefetch_feedback *f, int32_t l, int32_t rank);

/* The copy engine had been busy busy_s seconds in all at time now (executor figures). */
void fmoe__prefetch_feedback_link(prefetch_feedback *f, double busy_s, double now);

/* Expert e (l*J+j) was evicted. */
void fmoe__prefetch_feedback_evicted(prefetch_feedback *f, int32_t e);

/* The gate of layer l chose distinct[0..n): scores layer l's pending predictions and
 * victims and starts its next cycle. */
void fmoe__prefetch_feedback_gate(prefetch_feedback *f, int32_t l, const int32_t *distinct, int32_t n);

/* The estimates, for tests and reports. */
double fmoe__prefetch_feedback_accuracy(const prefetch_feedback *f, int32_t l, int32_t rank);
double fmoe__prefetch_feedback_regret(const prefetch_feedback *f);

#endif

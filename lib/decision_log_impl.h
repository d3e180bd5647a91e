/*
 * decision_log_impl.h - what the decision log's writer (decision_log.c) and reader
 * (decision_log_compare.c) share: the names that stand for enum values on a line.
 */
#ifndef FMOE_DECISION_LOG_IMPL_H
#define FMOE_DECISION_LOG_IMPL_H

#include "fmoe/decision_log.h"

#define FMOE__DECISION_KINDS 8 /* fmoe_decision_kind 0..FMOE_DECISION_LANDED */
#define FMOE__ACCESS_RESULTS 3 /* fmoe_access_result 0..FMOE_ACCESS_LATE_HIT */

/* "event" by fmoe_decision_kind, [FMOE__DECISION_KINDS]. */
extern const char *const fmoe__decision_event_names[FMOE__DECISION_KINDS];
/* "result" by fmoe_access_result, [FMOE__ACCESS_RESULTS]: miss, hit, late. */
extern const char *const fmoe__access_result_names[FMOE__ACCESS_RESULTS];

#endif

package store

import "testing"

// The rendered statements of the operator, the status and the metrics.
func TestOperatorSQL(t *testing.T) {
	s := testSchema(t)
	for name, sql := range map[string]string{
		"dead_letters_list":        s.listDeadLettersSQL(),
		"dead_letters_of":          s.deadLettersOfSQL(),
		"dead_letters_count":       s.countDeadLettersSQL(),
		"dead_letters_purge":       s.purgeDeadLettersSQL(),
		"dead_letters_replay":      s.replayDeadLettersSQL(),
		"dead_letters_replay_plan": s.planReplaySQL(),
		"archive_count":            s.countArchivedSQL(),
		"archive_replay":           s.replayArchiveSQL(),
		"archive_replay_to_route":  s.replayArchiveToRouteSQL(),
		"status_topics":            s.topicBacklogSQL(),
		"status_routes":            s.routeBacklogSQL(),
		"status_dead_by_reason":    s.deadByReasonSQL(),
		"status_relays":            s.relaysSQL(),
		"status_lanes":             s.laneCoverageSQL(),
		"metrics_totals":           s.totalsSQL(),
		"outbox_empty":             s.emptySQL(),
		"status_held_routes":       s.heldRoutesSQL(),
		"status_holds":             s.holdsSQL(),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			golden(t, name, sql)
		})
	}
}

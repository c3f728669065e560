package cli

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/relay"
)

// Which routes the fan-out router feeds is relay.SetConfig.Plan's, and
// tested there; fedRoutes only translates the config file's routes.
func TestFedRoutes(t *testing.T) {
	specs := []routeSpec{
		{Name: "orders", Topics: []string{"orders.*"}},
		{Name: "users", Topics: []string{"users.*"}},
		{Name: "audit", Topics: []string{"*.created"}, FanOut: true},
		{Name: "lonely", Topics: []string{"metrics"}, FanOut: true},
	}
	require.Equal(t, []bool{true, true, true, false}, fedRoutes(specs, false))
}

func TestConnBudget(t *testing.T) {
	one := []relay.Config{{Workers: 2}}
	max, workers, err := connBudget(one, 0)
	require.NoError(t, err)
	require.Equal(t, 7, max, "2 workers with 2 batches in flight each, lease, LISTEN, and one for health checks and metrics")
	require.Equal(t, 2, workers)
	max, _, err = connBudget([]relay.Config{{Workers: 2, Pipeline: 1}}, 0)
	require.NoError(t, err)
	require.Equal(t, 5, max, "one batch at a time: 2 workers, lease, LISTEN, health checks")
	max, _, err = connBudget(one, 4)
	require.NoError(t, err)
	require.Equal(t, 4, max, "the least: one batch per worker, health checks wait for a worker's connection")
	_, _, err = connBudget(one, 3)
	require.ErrorContains(t, err, "max-conns: 3 is below the 4 connections")

	// Routes (relay.SetConfig.Plan shares the LISTEN): per route its
	// workers and lease, one shared LISTEN.
	three, err := relay.SetConfig{Routes: []relay.Route{
		{Name: "a", Topics: []string{"a.*"}, Config: &relay.Config{Workers: 2}},
		{Name: "b", Topics: []string{"b.*"}, Config: &relay.Config{Workers: 1}},
		{Name: "c", Topics: []string{"*"}, Config: &relay.Config{Workers: 1}},
	}}.Plan()
	require.NoError(t, err)
	require.Len(t, three, 3, "a route takes every topic: no unrouted route")
	max, workers, err = connBudget(three, 0)
	require.NoError(t, err)
	require.Equal(t, 3+2+2+1+1+4, max, "and a second batch per worker")
	require.Equal(t, 4, workers)
	_, _, err = connBudget(three, 7)
	require.ErrorContains(t, err, "below the 8")
}

// Archive replay to one route goes to its copies when the relays isolate
// their routes; replay takes isolate-routes as run does: the flag, then
// OUTBOX_ISOLATE_ROUTES, then the config file.
func TestReplayReadsIsolateRoutesAsRunDoes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.yaml")
	routes := "routes:\n  - name: orders\n    topics: [\"orders.*\"]\n    sink: stdout\n  - name: users\n    topics: [\"users.*\"]\n    sink: stdout\n"
	for _, c := range []struct {
		name, file, env string
		args            []string
		want            bool
	}{
		{name: "unset"},
		{name: "file", file: "isolate-routes: true\n", want: true},
		{name: "env", env: "true", want: true},
		{name: "flag", args: []string{"--isolate-routes"}, want: true},
		{name: "env over file", file: "isolate-routes: true\n", env: "false"},
		{name: "flag over env", env: "false", args: []string{"--isolate-routes"}, want: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(c.file+routes), 0o600))
			if c.env != "" {
				t.Setenv("OUTBOX_ISOLATE_ROUTES", c.env)
			}
			g := &globals{stdout: io.Discard, stderr: io.Discard}
			cmd, _, err := newRoot(g).Find([]string{"replay"})
			require.NoError(t, err)
			require.NoError(t, cmd.ParseFlags(append([]string{"--config", path, "--route", "users", "--from", "1h"}, c.args...)))
			require.NoError(t, g.prepare(cmd))
			isolated, err := cmd.Flags().GetBool("isolate-routes")
			require.NoError(t, err)
			fed, err := routeIsFed(g, "users", isolated)
			require.NoError(t, err)
			require.Equal(t, c.want, fed)
		})
	}
}

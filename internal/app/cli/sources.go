package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// sourceSpec is one entry of the config file's sources list: an outbox
// that outbox-relay run relays from beside the others.
type sourceSpec struct {
	Name            string `yaml:"name"`
	DatabaseURL     string `yaml:"database-url"`
	DatabaseURLFile string `yaml:"database-url-file"`
	Schema          string `yaml:"schema"`
	Producer        string `yaml:"producer"`
	Weight          int    `yaml:"weight"`
}

// source is a resolved source.
type source struct {
	name     string
	url      string
	schema   string
	producer string
	weight   int // its part of --source-batches (0: 1)
}

// sourceName is the rule of relay.Sources for a source's name.
var sourceName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// parseSources decodes the config file's sources list, strictly; nil
// without one. Each source's schema defaults to --schema.
func (g *globals) parseSources() ([]source, error) {
	node := g.file.sections["sources"]
	if node == nil {
		return nil, nil
	}
	var specs []sourceSpec
	if err := strictDecode(node, &specs, "sources"); err != nil {
		return nil, configError(g.file.path, err)
	}
	if len(specs) == 0 {
		return nil, usagef("outbox: config %s: sources: empty list", g.file.path)
	}
	var out []source
	seen := map[string]bool{}
	for i, sp := range specs {
		field := fmt.Sprintf("sources[%d]", i)
		s, err := g.resolveSource(field, sp)
		if err != nil {
			return nil, err
		}
		if seen[s.name] {
			return nil, usagef("outbox: config %s: %s.name: %q used twice", g.file.path, field, s.name)
		}
		seen[s.name] = true
		out = append(out, s)
	}
	return out, nil
}

// resolveSource checks one entry of the sources list and reads its
// database-url-file.
func (g *globals) resolveSource(field string, sp sourceSpec) (source, error) {
	s := source{name: sp.Name, url: sp.DatabaseURL, schema: sp.Schema, producer: sp.Producer, weight: sp.Weight}
	switch {
	case sp.Weight < 0:
		return s, usagef("outbox: config %s: %s.weight: must be 1 or more, got %d", g.file.path, field, sp.Weight)
	case !sourceName.MatchString(sp.Name):
		return s, usagef("outbox: config %s: %s.name: %q must be 1-63 lower-case letters, digits, '.', '_' or '-'", g.file.path, field, sp.Name)
	case sp.DatabaseURL != "" && sp.DatabaseURLFile != "":
		return s, usagef("outbox: config %s: %s: give database-url or database-url-file, not both", g.file.path, field)
	case sp.DatabaseURL == "" && sp.DatabaseURLFile == "":
		return s, usagef("outbox: config %s: %s.database-url: required (or database-url-file)", g.file.path, field)
	}
	if sp.DatabaseURLFile != "" {
		b, fi, err := readRegularFile(field+".database-url-file", sp.DatabaseURLFile, maxSecretFileBytes)
		if err != nil {
			return s, err
		}
		if exposed(fi) {
			g.files.readable = append(g.files.readable, readableFile{env: field + ".database-url-file", path: sp.DatabaseURLFile, mode: fi.Mode().Perm()})
		}
		s.url = strings.TrimRight(string(b), "\r\n")
		g.files.secrets = append(g.files.secrets, fileSecret{env: field + ".database-url-file", path: sp.DatabaseURLFile, value: s.url})
	}
	if _, err := pgxpool.ParseConfig(s.url); err != nil {
		if err := databaseScheme(s.url); err != nil {
			return s, fmt.Errorf("%s: %w", field, err)
		}
		return s, usagef("outbox: %s.database-url: cannot parse %s", field, redactURL(s.url))
	}
	if s.schema == "" {
		s.schema = g.schema
	}
	if err := migrations.ValidateSchema(s.schema); err != nil {
		return s, usagef("outbox: %s.schema: %s", field, strings.TrimPrefix(err.Error(), "outbox: schema: "))
	}
	return s, nil
}

// pickSource applies --source: the chosen source's database URL and
// schema become the command's. Without --source, a config file with
// sources and a database URL of its own is a mistake: which one the
// command would use is not clear.
func (g *globals) pickSource() error {
	if g.sourceName == "" {
		if len(g.sources) > 0 && g.databaseURL != "" {
			return usagef("outbox: database-url: the config file lists sources, each with its database; remove database-url (set by %s), or give --source to pick a source", g.origins["database-url"])
		}
		return nil
	}
	if len(g.sources) == 0 {
		return usagef("outbox: source: %q: the config file lists no sources (a sources list in --config)", g.sourceName)
	}
	i := slices.IndexFunc(g.sources, func(s source) bool { return s.name == g.sourceName })
	if i < 0 {
		return usagef("outbox: source: %q is not one of the config file's sources (%s)", g.sourceName, strings.Join(g.sourceNames(), ", "))
	}
	if o := g.origins["database-url"]; g.databaseURL != "" && strings.HasPrefix(o, "--") {
		return usagef("outbox: source: gives the database of source %q; do not give --database-url too", g.sourceName)
	}
	s := g.sources[i]
	g.databaseURL, g.schema = s.url, s.schema
	g.sources = []source{s}
	return nil
}

// sourceNames lists the sources' names.
func (g *globals) sourceNames() []string {
	names := make([]string, len(g.sources))
	for i, s := range g.sources {
		names[i] = s.name
	}
	return names
}

// multiSource reports whether the command acts on every source of the
// config file's sources list (no --source picked one).
func (g *globals) multiSource() bool { return g.sourceName == "" && len(g.sources) > 0 }

// forEachSource runs fn once per source of the sources list, with that
// source's database URL and schema as the command's, or once with the
// command's own without a list (or with --source). It goes on past a
// source whose fn fails and returns every failure, each naming its
// source.
func (g *globals) forEachSource(fn func(name string) error) error {
	if !g.multiSource() {
		return fn("")
	}
	url, schema, log := g.databaseURL, g.schema, g.log
	defer func() { g.databaseURL, g.schema, g.log = url, schema, log }()
	var errs []error
	for _, s := range g.sources {
		g.databaseURL, g.schema, g.log = s.url, s.schema, log.With("source", s.name)
		if err := fn(s.name); err != nil {
			errs = append(errs, fmt.Errorf("source %s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// sourceStatus is one source's part of status.
type sourceStatus struct {
	Name   string           `json:"name"`
	Status *operator.Status `json:"status,omitempty"`
	Error  string           `json:"error,omitempty"`
}

// sourceStatusTimeout bounds each source's status, so that a database
// that does not answer cannot hold the others'.
const sourceStatusTimeout = 15 * time.Second

// statusOfSources prints the status of every source: a summary, a line
// a source, then each source's status as status prints one. A source
// whose database does not answer is shown with its error, and makes the
// command fail once every source is shown.
func (g *globals) statusOfSources(ctx context.Context, asJSON bool) error {
	var all []sourceStatus
	failed := 0
	_ = g.forEachSource(func(name string) error {
		sctx, cancel := context.WithTimeout(ctx, sourceStatusTimeout)
		defer cancel()
		st, err := g.status(sctx)
		ss := sourceStatus{Name: name}
		if err != nil {
			ss.Error, failed = g.files.scrub(err.Error()), failed+1
		} else {
			ss.Status = &st
		}
		all = append(all, ss)
		return nil
	})
	if asJSON {
		if err := writeJSON(g.stdout, map[string]any{"sources": all}); err != nil {
			return err
		}
	} else {
		printSources(g.stdout, all)
	}
	if failed > 0 {
		return fmt.Errorf("outbox: status: %d of %d sources did not answer", failed, len(all))
	}
	return nil
}

// printSources prints the summary of every source, then each one's
// status.
func printSources(out io.Writer, all []sourceStatus) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tDATABASE\tPENDING\tRETRYING\tOLDEST\tDEAD\tRELAYS")
	for _, s := range all {
		if s.Status == nil {
			fmt.Fprintf(tw, "%s\tno answer\t-\t-\t-\t-\t-\n", s.Name)
			continue
		}
		st := s.Status
		fmt.Fprintf(tw, "%s\tok\t%d\t%d\t%s\t%d\t%d\n", s.Name, st.Pending, st.Retrying, st.OldestAge.Round(time.Millisecond), st.DeadLetters, len(st.Relays))
	}
	_ = tw.Flush()
	for _, s := range all {
		fmt.Fprintf(out, "\n== source %s ==\n", s.Name)
		if s.Status == nil {
			fmt.Fprintln(out, s.Error)
			continue
		}
		printStatus(out, *s.Status)
	}
}

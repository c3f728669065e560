package cli

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// ReferencePath is where the generated command-line and configuration
// reference lives, relative to the repository's root.
const ReferencePath = "docs/cli.md"

// Reference renders the command-line and configuration reference
// (docs/cli.md) from the commands themselves: every command with its
// flags, their defaults, environment variables and config-file keys; the
// config file's sink sections and route keys. A test keeps the committed
// file equal to it; `go run ./internal/app/cli/gendoc` (make docs) rewrites it.
func Reference() []byte {
	root := newRoot(&globals{stdout: io.Discard, stderr: io.Discard})
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Command-line and configuration reference\n\n")
	w("<!-- Generated from the commands by `go run ./internal/app/cli/gendoc` (make docs); do not edit.\n")
	w("     internal/app/cli's TestReferenceIsCurrent fails when this file and the commands differ. -->\n\n")
	w("Every option of `outbox-relay` is a flag, an environment variable or a key of\n")
	w("the YAML file named by `--config` (or `OUTBOX_CONFIG`), with that precedence:\n")
	w("flags > environment > file. File keys are the long flag names. Any\n")
	w("environment variable may instead name a file holding its value, with a `_FILE`\n")
	w("suffix (`OUTBOX_DATABASE_URL_FILE=/run/secrets/db`). Options marked\n")
	w("*command line only* are never read from the environment or the file.\n")
	w("How to choose the values: [operations.md](operations.md).\n\n")

	var names []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { names = append(names, "`--"+f.Name+"`") })
	inherited := strings.Join(names, ", ")
	cmds := commands(root)
	w("Commands:\n\n")
	for _, c := range cmds {
		w("- [`%s`](#%s): %s\n", c.CommandPath(), anchor(c.CommandPath()), c.Short)
	}
	w("\n")
	for _, c := range cmds {
		w("## %s\n\n", c.CommandPath())
		if c.Long != "" {
			w("%s\n\n", strings.TrimSpace(c.Long))
		} else if c.Short != "" {
			w("%s.\n\n", c.Short)
		}
		w("```\n%s\n```\n\n", c.UseLine())
		if c.Example != "" {
			w("Example:\n\n```\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
		}
		flagTable(&b, c.LocalFlags())
		if c != root && c.HasAvailableInheritedFlags() {
			w("The options of [`outbox-relay`](#outbox-relay) (%s) apply too.\n\n", inherited)
		}
	}

	w("## Config file\n\n")
	w("Besides the flags' long names, the file takes these sections (unknown keys,\n")
	w("duplicate keys and a section for another sink than the configured one are\n")
	w("refused with their line number):\n\n")
	w("| key | holds |\n|---|---|\n")
	for _, d := range sinkDrivers.Drivers() {
		if d.Section != "" {
			w("| `%s:` | options of the `%s` sink: [sinks/%s.md](sinks/%s.md) |\n", d.Section, strings.Join(d.Schemes, "`, `"), sinkPage(d), sinkPage(d))
		}
	}
	w("| `routes:` | a list of routes (below), exclusive with `--sink` |\n\n")
	w("A sink's section and its URL (`--sink`, or a route's `sink`) are read\n")
	w("together and checked as one: a key the URL leaves out may come from the\n")
	w("section. A key set in both must have the same value in both; different\n")
	w("values are refused (exit status 2) with the key's line and where the URL\n")
	w("came from. Each page of docs/sinks shows a complete file.\n\n")
	w("### Sink URLs\n\n")
	w("| schemes | URL query parameters (each also a key of the sink's section) | page |\n|---|---|---|\n")
	for _, d := range sinkDrivers.Drivers() {
		params := "none"
		if len(d.Params) > 0 {
			params = "`" + strings.Join(d.Params, "`, `") + "`"
		}
		w("| `%s` | %s | [sinks/%s.md](sinks/%s.md) |\n", strings.Join(d.Schemes, "`, `"), params, sinkPage(d), sinkPage(d))
	}
	w("\n### Route keys\n\n")
	w("Each entry of `routes:` takes these keys; the unset ones inherit the\n")
	w("top-level options. A route may also hold the section of its own sink.\n\n")
	w("| key | type |\n|---|---|\n")
	rt := reflect.TypeFor[routeSpec]()
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" {
			continue
		}
		typ := f.Type
		if typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		w("| `%s` | %s |\n", name, typeName(typ))
	}
	return b.Bytes()
}

// sinkPage names the page of docs/sinks that documents d: its section's
// name, or stdout.md for the sinks without options (stdout, discard).
func sinkPage(d sinks.Driver) string {
	if d.Section == "" {
		return "stdout"
	}
	return d.Section
}

// commands lists root and its subcommands depth first, help and hidden
// commands left out.
func commands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		out = append(out, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

func flagTable(b *bytes.Buffer, fs *pflag.FlagSet) {
	var rows []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := "`" + f.DefValue + "`"
		if f.DefValue == "" || f.DefValue == "[]" || (f.Value.Type() == "bool" && f.DefValue == "false") {
			def = ""
		}
		usage := f.Usage
		var from string
		switch {
		case f.Name == "config":
			from = "`OUTBOX_CONFIG`"
			usage = strings.TrimSuffix(usage, " (env OUTBOX_CONFIG)")
		case isCLIOnly(f):
			from = "*command line only*"
		default:
			env := envNames(f.Name)
			slices.Sort(env)
			usage = strings.TrimSuffix(usage, " (env "+strings.Join(env, ", ")+")")
			from = "`" + strings.Join(envNames(f.Name), "`, `") + "`; file `" + f.Name + ":`"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s |", name, def, from, escapeCell(usage)))
	})
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "| option | default | environment; file | meaning |\n|---|---|---|---|\n%s\n\n", strings.Join(rows, "\n"))
}

func escapeCell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// anchor is the heading id GitHub gives "## outbox-relay dlq list".
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}

func typeName(t reflect.Type) string {
	switch t.String() {
	case "time.Duration":
		return "duration (`30s`, `5m`)"
	case "[]string":
		return "list of topic patterns"
	case "int", "int64":
		return "integer"
	}
	return t.String()
}

// SinkPages maps each page of docs/ that documents sinks to the URL
// parameters it must name, for the test that keeps them documented.
func SinkPages() map[string][]string {
	pages := map[string][]string{}
	for _, d := range sinkDrivers.Drivers() {
		page := "sinks/" + sinkPage(d) + ".md"
		pages[page] = append(pages[page], d.Params...)
	}
	return pages
}

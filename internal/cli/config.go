package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/outbox-relay/outbox-relay/internal/redact"
)

// usageError marks errors caused by invalid configuration or arguments:
// the process exits with status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// sinkSections are the config-file keys that hold structured sink options
// rather than flag values.
var sinkSections = []string{"kafka", "amqp", "http", "routes"}

// fileConfig is the parsed optional YAML file: flag values by flag name,
// and raw sink sections decoded later by the sink that needs them.
type fileConfig struct {
	path     string
	values   map[string]string
	sections map[string]*yaml.Node
}

// envNames returns the environment variables that may set flag name, in
// order of preference.
func envNames(name string) []string {
	env := "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if name == "database-url" {
		return []string{env, "DATABASE_URL"}
	}
	return []string{env}
}

// lookupEnv reads a variable, or the file named by its _FILE twin (for
// secrets mounted as files).
func lookupEnv(name string) (string, bool, error) {
	if v, ok := os.LookupEnv(name); ok {
		return v, true, nil
	}
	if path, ok := os.LookupEnv(name + "_FILE"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false, usagef("outbox: %s_FILE: %v", name, err)
		}
		return strings.TrimRight(string(b), "\r\n"), true, nil
	}
	return "", false, nil
}

// loadFile parses the YAML config file. Keys are flag names; any key that
// is neither a known flag nor a sink section is an error.
func loadFile(path string, known map[string]bool) (*fileConfig, error) {
	fc := &fileConfig{path: path, values: map[string]string{}, sections: map[string]*yaml.Node{}}
	if path == "" {
		return fc, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("outbox: config: %v", err)
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return fc, nil
		}
		return nil, usagef("outbox: config %s: %v", path, err)
	}
	if len(root.Content) == 0 {
		return fc, nil
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, usagef("outbox: config %s: the top level must be a mapping of option names to values", path)
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		key := strings.ReplaceAll(k.Value, "_", "-")
		if contains(sinkSections, key) {
			fc.sections[key] = v
			continue
		}
		if !known[key] {
			return nil, usagef("outbox: config %s line %d: unknown option %q (options are the long flag names; see --help)", path, k.Line, k.Value)
		}
		switch v.Kind {
		case yaml.ScalarNode:
			fc.values[key] = v.Value
		case yaml.SequenceNode:
			var items []string
			for _, it := range v.Content {
				if it.Kind != yaml.ScalarNode {
					return nil, usagef("outbox: config %s line %d: %s: list items must be plain values", path, it.Line, k.Value)
				}
				items = append(items, it.Value)
			}
			fc.values[key] = strings.Join(items, ",")
		default:
			return nil, usagef("outbox: config %s line %d: %s: must be a plain value", path, v.Line, k.Value)
		}
	}
	return fc, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// allFlagNames collects every long flag of the command tree, for
// validating the config file.
func allFlagNames(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) {
			if !isCLIOnly(f) {
				known[f.Name] = true
			}
		}
		c.Flags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	delete(known, "help")
	delete(known, "config")
	return known
}

// cliOnlyAnnotation marks flags that must be given on the command line:
// selectors and switches of operator commands, which an environment
// variable or a config file must never supply by accident (an OUTBOX_ALL
// in the environment must not make `dlq purge` purge everything).
const cliOnlyAnnotation = "outbox-cli-only"

// cliOnly marks every local flag of cmd as command-line only.
func cliOnly(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		_ = cmd.Flags().SetAnnotation(f.Name, cliOnlyAnnotation, []string{"true"})
	})
	return cmd
}

func isCLIOnly(f *pflag.Flag) bool { return len(f.Annotations[cliOnlyAnnotation]) > 0 }

// resolve fills every flag the user did not set on the command line from
// the environment, then from the config file: flags > env > file.
func resolve(cmd *cobra.Command, fc *fileConfig) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" || f.Name == "config" || isCLIOnly(f) {
			return
		}
		for _, env := range envNames(f.Name) {
			v, ok, err := lookupEnv(env)
			if err != nil {
				errs = append(errs, err)
				return
			}
			if ok {
				if err := f.Value.Set(v); err != nil {
					errs = append(errs, usagef("outbox: %s (from %s): %v", f.Name, env, redactErr(f.Name, err)))
				}
				return
			}
		}
		if v, ok := fc.values[f.Name]; ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, usagef("outbox: %s (from %s): %v", f.Name, fc.path, redactErr(f.Name, err)))
			}
		}
	})
	return errors.Join(errs...)
}

func redactErr(flag string, err error) error {
	if flag == "database-url" || flag == "sink" {
		return errors.New("invalid value")
	}
	return err
}

// redactURL hides the credentials in a database or sink URL (well-formed
// or not, or a key/value connection string) for logs and errors.
func redactURL(raw string) string { return redact.URL(raw) }

// yamlValue matches the value yaml.v3 quotes in a type error
// ("cannot unmarshal !!str `hunter2` into int"): the value may be a secret
// in the wrong place.
var yamlValue = regexp.MustCompile("(cannot unmarshal \\S+) `.*?` into ")

// yamlError drops the values yaml.v3 quotes in its errors, keeping the line
// and the types.
func yamlError(err error) string {
	return yamlValue.ReplaceAllString(err.Error(), "$1 value into ")
}

// envHelp appends the environment variable names to every flag's usage.
func envHelp(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || isCLIOnly(f) {
			return
		}
		names := envNames(f.Name)
		sort.Strings(names)
		f.Usage += " (env " + strings.Join(names, ", ") + ")"
	})
}

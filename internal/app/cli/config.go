package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"

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
var sinkSections = append(sinkDrivers.Sections(), "routes", "sources")

// fileConfig is the parsed optional YAML file: flag values by flag name,
// and raw sink sections decoded later by the sink that needs them.
type fileConfig struct {
	path     string
	values   map[string]string
	sections map[string]*yaml.Node
	lines    map[string]int // line of each key, values' and sections'
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

// fileOptions are the options whose environment variable has a _FILE
// twin naming a file that holds the value: the ones that carry secrets
// (a database password, a sink's credentials), for secrets mounted as
// files. Any other option's _FILE twin is refused unread: a secret file
// wired to the wrong option (OUTBOX_WORKERS_FILE) would otherwise come
// back in that option's parse error, and one wired to OUTBOX_ID_FILE in
// every log line.
var fileOptions = []string{"database-url", "sink"}

// envFiles is what reading the environment found out about *_FILE
// variables, for prepare and Main to use once they can.
type envFiles struct {
	// readable are secret files others can read: accepted (Docker and
	// Kubernetes mount secrets 0444/0644 by default) and logged as a
	// warning once the logger exists.
	readable []readableFile
	// secrets are the values read through *_FILE: Main takes them out of
	// the error it prints, whatever part of the command echoed them.
	secrets []fileSecret
}

// readableFile is a *_FILE secret that others can read: everyone, or a
// group this process is not in.
type readableFile struct {
	env  string
	path string
	mode fs.FileMode
}

// fileSecret is a value read through the *_FILE variable env.
type fileSecret struct {
	env, path, value string
}

// lookupEnv reads the variable name of option flag, or the file named by
// its _FILE twin where flag is one of fileOptions. Errors about the file
// name the variable and the path, never the content.
func lookupEnv(flag, name string, ef *envFiles) (string, bool, error) {
	path, isFile := os.LookupEnv(name + "_FILE")
	if isFile && !slices.Contains(fileOptions, flag) {
		instead := name + ", or " + flag + " in the --config file"
		if flag == "config" {
			instead = name + " or --config"
		}
		return "", false, usagef("outbox: %s_FILE: %s is not a secret and is not read from a file (only %s are): set %s",
			name, flag, strings.Join(fileOptions, " and "), instead)
	}
	if v, ok := os.LookupEnv(name); ok {
		return v, true, nil
	}
	if !isFile {
		return "", false, nil
	}
	// Stat of the opened file follows symlinks: Kubernetes mounts a
	// secret as a link to the file whose mode counts.
	b, fi, err := readRegularFile(name+"_FILE", path, maxSecretFileBytes)
	if err != nil {
		return "", false, err
	}
	if exposed(fi) {
		ef.readable = append(ef.readable, readableFile{env: name + "_FILE", path: path, mode: fi.Mode().Perm()})
	}
	v := strings.TrimRight(string(b), "\r\n")
	if strings.ContainsFunc(v, unicode.IsControl) {
		// Not a secret of one line (/proc/self/environ, a binary): an
		// error about it could only show it, escaped past recognition.
		return "", false, usagef("outbox: %s_FILE: %s holds more than one line or control characters; the file holds the value alone", name, path)
	}
	ef.secrets = append(ef.secrets, fileSecret{env: name + "_FILE", path: path, value: v})
	return v, true, nil
}

// scrub replaces in msg every value read through a *_FILE variable, as
// written and as redactURL shows it, with the variable's name and path.
func (ef *envFiles) scrub(msg string) string {
	for _, s := range ef.secrets {
		if s.value == "" {
			continue
		}
		with := "(the value of " + s.env + "=" + s.path + ")"
		// As written, as redactURL shows it, and each of those as %q
		// escapes it.
		for _, form := range []string{redactURL(s.value), s.value} {
			if form == "" {
				continue
			}
			msg = strings.ReplaceAll(msg, form, with)
			if q := strconv.Quote(form); q[1:len(q)-1] != form {
				msg = strings.ReplaceAll(msg, q[1:len(q)-1], with)
			}
		}
	}
	return msg
}

// exposed reports whether users other than the file's owner and this
// process's groups can read it.
func exposed(fi fs.FileInfo) bool {
	perm := fi.Mode().Perm()
	return perm&0o004 != 0 || perm&0o040 != 0 && !groupIsOurs(fi)
}

// warnReadable logs the secret files others can read.
func warnReadable(log *slog.Logger, files []readableFile) {
	for _, f := range files {
		log.Warn("secret file is readable by other users; make it 0400 or 0600 (in Kubernetes, where the file belongs to root: defaultMode 0440 and the pod's fsGroup)",
			"env", f.env, "path", f.path, "mode", f.mode.String())
	}
}

// loadFile parses the YAML config file. Keys are flag names; any key that
// is neither a known flag nor a sink section is an error, and so are a
// duplicate key anywhere in the file and a second YAML document.
func loadFile(path string, known map[string]bool) (*fileConfig, error) {
	fc := &fileConfig{path: path, values: map[string]string{}, sections: map[string]*yaml.Node{}, lines: map[string]int{}}
	if path == "" {
		return fc, nil
	}
	raw, _, err := readRegularFile("config", path, maxConfigFileBytes)
	if err != nil {
		return nil, err
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return fc, nil
		}
		return nil, usagef("outbox: config %s: %v", path, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, usagef("outbox: config %s: after the first document: %v", path, err)
	case !emptyDocument(&next):
		return nil, usagef("outbox: config %s line %d: a second YAML document; the config file holds one (remove the \"---\")", path, next.Line)
	}
	if len(root.Content) == 0 {
		return fc, nil
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, usagef("outbox: config %s: the top level must be a mapping of option names to values", path)
	}
	if err := duplicateKeys(doc, true); err != nil {
		return nil, configError(path, err)
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		k, v := doc.Content[i], doc.Content[i+1]
		key := strings.ReplaceAll(k.Value, "_", "-")
		if contains(sinkSections, key) {
			fc.sections[key] = v
			fc.lines[key] = k.Line
			continue
		}
		if !known[key] {
			return nil, usagef("outbox: config %s line %d: unknown option %q%s (options are the long flag names; see --help)", path, k.Line, k.Value, nearestOption(known, key))
		}
		fc.lines[key] = k.Line
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

// emptyDocument reports whether doc holds nothing (a trailing "---").
func emptyDocument(doc *yaml.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return len(doc.Content) == 1 && n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == ""
}

// duplicateKeys reports the first key that a mapping in n repeats: YAML
// parsers keep the last and drop the first without a word. At the top
// level, "batch-size" and "batch_size" are the same option.
func duplicateKeys(n *yaml.Node, top bool) error {
	if n.Kind == yaml.MappingNode {
		type seen struct {
			line int
			as   string
		}
		first := map[string]seen{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Value == "<<" {
				continue // merge keys may repeat; complex keys are rare
			}
			key := k.Value
			if top {
				key = strings.ReplaceAll(key, "_", "-")
			}
			if f, dup := first[key]; dup {
				also := ""
				if f.as != k.Value {
					also = fmt.Sprintf(" as %q", f.as)
				}
				return fmt.Errorf("line %d: duplicate key %q (first at line %d%s)", k.Line, k.Value, f.line, also)
			}
			first[key] = seen{k.Line, k.Value}
		}
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		if err := duplicateKeys(c, false); err != nil {
			return err
		}
	}
	return nil
}

// strictDecode decodes node into v (a pointer) like a decoder with
// KnownFields, but keeps the file's line numbers, which re-encoding the
// node for such a decoder would renumber: unknown keys are found by
// walking the node along v's type. path names node in errors.
func strictDecode(node *yaml.Node, v any, path string) error {
	paths := map[int]string{}
	if err := knownFields(node, reflect.TypeOf(v).Elem(), path, paths); err != nil {
		return err
	}
	err := node.Decode(v)
	var te *yaml.TypeError
	if errors.As(err, &te) {
		// "line 3: cannot unmarshal ..." becomes "line 3: kafka.sasl:
		// ...", naming the field that starts on that line.
		msgs := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			e = yamlValue.ReplaceAllString(e, "$1 value into ")
			if line, rest, ok := strings.Cut(e, ": "); ok && strings.HasPrefix(line, "line ") {
				field := path
				if n, err := strconv.Atoi(strings.TrimPrefix(line, "line ")); err == nil && paths[n] != "" {
					field = paths[n]
				}
				msgs[i] = line + ": " + field + ": " + rest
			} else {
				msgs[i] = path + ": " + e
			}
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	if err != nil {
		return fmt.Errorf("%s: %s", path, yamlError(err))
	}
	return nil
}

// configError formats an error about the config file at path: "config
// FILE line N: ..." when err starts with its line.
func configError(path string, err error) error {
	if strings.HasPrefix(err.Error(), "line ") {
		return usagef("outbox: config %s %v", path, err)
	}
	return usagef("outbox: config %s: %v", path, err)
}

var (
	nodeType        = reflect.TypeOf(yaml.Node{})
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// knownFields reports the first mapping key in n that names no field of
// t. Type mismatches are left to yaml's decoder; paths records, by line,
// the deepest field whose value starts there, to name it in those errors.
func knownFields(n *yaml.Node, t reflect.Type, path string, paths map[int]string) error {
	paths[n.Line] = path
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias // recursion follows t, which is finite
	}
	if t == nodeType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields, anyKey := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				merged := []*yaml.Node{v}
				if v.Kind == yaml.SequenceNode {
					merged = v.Content
				}
				for _, m := range merged {
					if err := knownFields(m, t, path, paths); err != nil {
						return err
					}
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				if anyKey {
					continue
				}
				return fmt.Errorf("line %d: %s.%s: unknown key %q in %s%s", k.Line, path, k.Value, k.Value, section(path), knownKeys(fields, k.Value))
			}
			if err := knownFields(v, ft, path+"."+k.Value, paths); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, it := range n.Content {
			if err := knownFields(it, t.Elem(), fmt.Sprintf("%s[%d]", path, i), paths); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := knownFields(n.Content[i+1], t.Elem(), path+"."+n.Content[i].Value, paths); err != nil {
				return err
			}
		}
	}
	return nil
}

// section names the part of the file holding path for an error:
// "section http", "section kafka.sasl", "routes[0]".
func section(path string) string {
	if strings.HasSuffix(path, "]") {
		return path
	}
	return "section " + path
}

// knownKeys lists the keys a mapping accepts, the nearest to key (a
// likely typo) first when there is one.
func knownKeys(fields map[string]reflect.Type, key string) string {
	names := make([]string, 0, len(fields))
	best, bestD := "", 3
	for f := range fields {
		names = append(names, f)
		if d := editDistance(f, key); d < bestD || (d == bestD && f < best) {
			best, bestD = f, d
		}
	}
	sort.Strings(names)
	out := "; known keys: " + strings.Join(names, ", ")
	if best != "" {
		out = fmt.Sprintf(" (did you mean %q?)", best) + out
	}
	return out
}

// nearestOption suggests the option or sink section nearest to key (a
// likely typo: "worker" for "workers"), or says nothing.
func nearestOption(known map[string]bool, key string) string {
	best, bestD := "", 3
	consider := func(name string) {
		if d := editDistance(name, key); d < bestD || (d == bestD && name < best) {
			best, bestD = name, d
		}
	}
	for name := range known {
		consider(name)
	}
	for _, name := range sinkSections {
		consider(name)
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance of a and b (keys are short).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// yamlFields maps the keys yaml.v3 accepts for struct t to their types;
// anyKey is true when an inline map takes the rest.
func yamlFields(t reflect.Type) (fields map[string]reflect.Type, anyKey bool) {
	fields = map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Map {
				anyKey = true
				continue
			}
			inner, innerAny := yamlFields(ft)
			for k, v := range inner {
				fields[k] = v
			}
			anyKey = anyKey || innerAny
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields, anyKey
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
// What it learns of *_FILE variables goes to ef; where each value came
// from ("--sink", "OUTBOX_SINK", "sink at line 3") goes to origins, for
// errors that must name it.
func resolve(cmd *cobra.Command, fc *fileConfig, ef *envFiles, origins map[string]string) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			origins[f.Name] = "--" + f.Name
		}
		if f.Changed || f.Name == "help" || f.Name == "config" || isCLIOnly(f) {
			return
		}
		for _, env := range envNames(f.Name) {
			_, fromFile := os.LookupEnv(env + "_FILE")
			_, plain := os.LookupEnv(env)
			v, ok, err := lookupEnv(f.Name, env, ef)
			if err != nil {
				errs = append(errs, err)
				return
			}
			if ok {
				origins[f.Name] = env
				if fromFile && !plain {
					origins[f.Name] = env + "_FILE"
				}
				if err := f.Value.Set(v); err != nil {
					if fromFile && !plain {
						errs = append(errs, usagef("outbox: %s (from %s_FILE=%s): not a valid value (the file's content is not shown)", f.Name, env, os.Getenv(env+"_FILE")))
					} else {
						errs = append(errs, usagef("outbox: %s (from %s): %v", f.Name, env, valueError(f, v, err)))
					}
				}
				return
			}
		}
		if v, ok := fc.values[f.Name]; ok {
			origins[f.Name] = fmt.Sprintf("%s at line %d", f.Name, fc.lines[f.Name])
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, usagef("outbox: config %s line %d: %s: %v", fc.path, fc.lines[f.Name], f.Name, valueError(f, v, err)))
			}
		}
	})
	return errors.Join(errs...)
}

// valueError says what is wrong with v, flag f's value from the
// environment or the file: what the flag takes ("an integer") rather than
// Go's strconv text. The values of the options that hold secrets are not
// repeated.
func valueError(f *pflag.Flag, v string, err error) error {
	if f.Name == "database-url" || f.Name == "sink" {
		return errors.New("invalid value")
	}
	want, ok := flagSyntax[f.Value.Type()]
	if !ok {
		return err
	}
	return fmt.Errorf("%q is not %s", redactURL(v), want)
}

// flagSyntax names what a flag of each pflag type takes, for valueError.
var flagSyntax = map[string]string{
	"int":      "an integer",
	"int32":    "an integer",
	"int64":    "an integer",
	"uint":     "a whole number",
	"float64":  "a number",
	"bool":     "true or false",
	"duration": "a duration such as 30s or 5m",
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

package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit/relaybin"
)

const (
	finalBase   = "gcr.io/distroless/static-debian12:nonroot"
	versionFlag = "-X github.com/outbox-relay/outbox-relay/internal/app/cli.Version=${VERSION} -X github.com/outbox-relay/outbox-relay/internal/app/cli.Commit=${COMMIT}"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
	line int
}

type stage struct {
	image string // ARGs expanded
	name  string
	instr []instruction
}

type dockerfile struct {
	globalArgs map[string]string
	stages     []stage
}

// parseDockerfile reads the subset of the Dockerfile syntax this project
// uses: comments, backslash continuations, ARG before the first FROM
// (expanded in FROM), FROM ... AS name.
func parseDockerfile(text string) (dockerfile, error) {
	df := dockerfile{globalArgs: map[string]string{}}
	var instrs []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body)
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		full := strings.TrimSpace(cur.String())
		cur.Reset()
		cmd, args, _ := strings.Cut(full, " ")
		instrs = append(instrs, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
	}
	if cur.Len() > 0 {
		return df, fmt.Errorf("line %d: continuation at end of file", start)
	}
	for _, in := range instrs {
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			if len(f) != 1 && !(len(f) == 3 && strings.EqualFold(f[1], "AS")) {
				return df, fmt.Errorf("line %d: FROM %s: want FROM [--platform=...] image [AS name]", in.line, in.args)
			}
			s := stage{image: os.Expand(f[0], func(k string) string { return df.globalArgs[k] })}
			if len(f) == 3 {
				s.name = f[2]
			}
			df.stages = append(df.stages, s)
		case len(df.stages) == 0:
			if in.cmd != "ARG" {
				return df, fmt.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
			}
			for _, a := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(a, "=")
				df.globalArgs[k] = v
			}
		default:
			s := &df.stages[len(df.stages)-1]
			s.instr = append(s.instr, in)
		}
	}
	if len(df.stages) == 0 {
		return df, fmt.Errorf("no FROM")
	}
	return df, nil
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.instr {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// last returns the instruction that takes effect (the last of its kind).
func (s stage) last(cmd string) (instruction, bool) {
	all := s.all(cmd)
	if len(all) == 0 {
		return instruction{}, false
	}
	return all[len(all)-1], true
}

// execForm decodes a JSON-array (exec form) argument list.
func execForm(args string) ([]string, bool) {
	if !strings.HasPrefix(args, "[") {
		return nil, false
	}
	var v []string
	if err := json.Unmarshal([]byte(args), &v); err != nil || len(v) == 0 {
		return nil, false
	}
	return v, true
}

func loadDockerfile(t *testing.T) dockerfile {
	t.Helper()
	df, err := parseDockerfile(string(readFile(t, "Dockerfile")))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return df
}

// buildRun returns the builder stage and its RUN instruction that runs
// `go build`.
func buildRun(t *testing.T, df dockerfile) (stage, instruction) {
	t.Helper()
	for _, s := range df.stages[:len(df.stages)-1] {
		for _, in := range s.all("RUN") {
			if strings.Contains(in.args, "go build") {
				return s, in
			}
		}
	}
	t.Fatal("Dockerfile: no RUN ... go build before the final stage")
	return stage{}, instruction{}
}

func TestDockerfileFinalStage(t *testing.T) {
	t.Parallel()
	df := loadDockerfile(t)
	final := df.stages[len(df.stages)-1]

	if final.image != finalBase && !strings.HasPrefix(final.image, finalBase+"@sha256:") {
		t.Errorf("final stage FROM %s, want %s (static binary, no shell, nonroot)", final.image, finalBase)
	}
	// distroless has no shell: a RUN or a shell-form command cannot work.
	for _, in := range final.all("RUN") {
		t.Errorf("line %d: RUN in the final stage: the distroless image has no shell", in.line)
	}
	if in, ok := final.last("USER"); !ok {
		t.Error("final stage has no USER (want nonroot:nonroot)")
	} else if in.args != "nonroot:nonroot" && in.args != "65532:65532" {
		t.Errorf("line %d: USER %s, want nonroot:nonroot", in.line, in.args)
	}
	want := map[string][]string{
		"ENTRYPOINT": {"/outbox-relay"},
		"CMD":        {"run"},
	}
	for cmd, w := range want {
		in, ok := final.last(cmd)
		if !ok {
			t.Errorf("final stage has no %s", cmd)
			continue
		}
		got, ok := execForm(in.args)
		if !ok {
			t.Errorf("line %d: %s %s is not in exec form (JSON array); the image has no shell", in.line, cmd, in.args)
		} else if !slices.Equal(got, w) {
			t.Errorf("line %d: %s %q, want %q", in.line, cmd, got, w)
		}
	}

	hc, ok := final.last("HEALTHCHECK")
	if !ok {
		t.Fatal("final stage has no HEALTHCHECK")
	}
	rest := hc.args
	for strings.HasPrefix(rest, "--") {
		opt, after, _ := strings.Cut(rest, " ")
		rest = strings.TrimSpace(after)
		name, val, _ := strings.Cut(strings.TrimPrefix(opt, "--"), "=")
		switch name {
		case "interval", "timeout", "start-period", "start-interval":
			if d, err := time.ParseDuration(val); err != nil || d <= 0 {
				t.Errorf("line %d: HEALTHCHECK --%s=%s is not a positive duration", hc.line, name, val)
			}
		case "retries":
			if n, err := strconv.Atoi(val); err != nil || n < 1 {
				t.Errorf("line %d: HEALTHCHECK --retries=%s", hc.line, val)
			}
		default:
			t.Errorf("line %d: HEALTHCHECK: unknown option --%s", hc.line, name)
		}
	}
	cmdArgs, ok := strings.CutPrefix(rest, "CMD ")
	if !ok {
		t.Fatalf("line %d: HEALTHCHECK %s: want HEALTHCHECK [options] CMD [...]", hc.line, hc.args)
	}
	got, ok := execForm(strings.TrimSpace(cmdArgs))
	if !ok {
		t.Errorf("line %d: HEALTHCHECK CMD %s is not in exec form; the image has no shell", hc.line, cmdArgs)
	} else if !slices.Equal(got, []string{"/outbox-relay", "healthcheck"}) {
		t.Errorf("line %d: HEALTHCHECK CMD %q, want [/outbox-relay healthcheck]", hc.line, got)
	}

	// Both binaries come from the builder stage.
	builder, _ := buildRun(t, df)
	copied := map[string]bool{}
	for _, in := range final.all("COPY") {
		f := strings.Fields(in.args)
		if len(f) < 3 || f[0] != "--from="+builder.name {
			continue
		}
		if dst := f[len(f)-1]; dst != "/" {
			t.Errorf("line %d: COPY to %s, want the binaries in /", in.line, dst)
		}
		for _, src := range f[1 : len(f)-1] {
			copied[filepath.Base(src)] = true
		}
	}
	for _, bin := range []string{"outbox-relay", "outbox-demo"} {
		if !copied[bin] {
			t.Errorf("final stage does not COPY --from=%s %s into /", builder.name, bin)
		}
	}
}

// goVersion parses "1.26" or "1.26.8" (a Go release or image tag prefix).
func goVersion(s string) ([3]int, bool) {
	m := regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?`).FindStringSubmatch(s)
	if m == nil {
		return [3]int{}, false
	}
	var v [3]int
	for i := range 3 {
		if m[i+1] != "" {
			v[i], _ = strconv.Atoi(m[i+1])
		} else {
			v[i] = -1 // a floating tag: the newest patch release
		}
	}
	return v, true
}

func TestDockerfileBuilder(t *testing.T) {
	t.Parallel()
	df := loadDockerfile(t)
	builder, run := buildRun(t, df)

	repo, tag, ok := strings.Cut(builder.image, ":")
	if !ok || repo != "golang" {
		t.Fatalf("builder FROM %s, want golang:<version>", builder.image)
	}
	img, ok := goVersion(tag)
	if !ok {
		t.Fatalf("builder FROM %s: pin a Go version in the tag", builder.image)
	}
	m := regexp.MustCompile(`(?m)^go\s+(\S+)`).FindSubmatch(readFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	mod, _ := goVersion(string(m[1]))
	if img[0] != mod[0] || img[1] != mod[1] || (img[2] >= 0 && img[2] < mod[2]) {
		t.Errorf("builder FROM %s does not satisfy go.mod's go %s", builder.image, m[1])
	}

	// The image's binaries are built as make build and the suites'
	// relays are (relaybin's static settings).
	static := append(slices.Clone(relaybin.StaticEnv), relaybin.StaticFlags...)
	for _, want := range append(static, `-ldflags "-s -w `+versionFlag+`"`,
		"./cmd/outbox-relay", "./cmd/outbox-demo", "-o /out/") {
		if !strings.Contains(run.args, want) {
			t.Errorf("line %d: the go build step lacks %s", run.line, want)
		}
	}
	recipe := regexp.MustCompile(`(?m)^build:.*\n\t(.*)$`).FindSubmatch(readFile(t, "Makefile"))
	if recipe == nil {
		t.Fatal("the Makefile has no build target")
	}
	for _, want := range static {
		if !strings.Contains(string(recipe[1]), want) {
			t.Errorf("the Makefile's build target (%s) lacks %s, which the image's build uses", recipe[1], want)
		}
	}
	var declared []string
	for _, in := range builder.all("ARG") {
		for _, a := range strings.Fields(in.args) {
			k, _, _ := strings.Cut(a, "=")
			declared = append(declared, k)
		}
	}
	for _, arg := range []string{"VERSION", "COMMIT", "TARGETOS", "TARGETARCH"} {
		if strings.Contains(run.args, arg) && !slices.Contains(declared, arg) {
			t.Errorf("line %d: the go build step uses ${%s}, which the builder stage does not declare with ARG", run.line, arg)
		}
	}
}

// TestDockerfileBuildStep runs the Dockerfile's go build step on this
// machine (for its own OS and architecture) and checks what it produces:
// static, stripped binaries that report the version given at build time.
func TestDockerfileBuildStep(t *testing.T) {
	t.Parallel()
	df := loadDockerfile(t)
	_, run := buildRun(t, df)

	// Drop RUN's own options (--mount=...): what is left is the shell
	// command docker runs in /src, a copy of the repository.
	script := run.args
	for strings.HasPrefix(script, "--") {
		_, script, _ = strings.Cut(script, " ")
		script = strings.TrimSpace(script)
	}
	out := filepath.Join(t.TempDir(), "out") // go build must create it, as in the image
	if !strings.Contains(script, "/out/") {
		t.Fatalf("line %d: the go build step does not write to /out/", run.line)
	}
	script = strings.ReplaceAll(script, "/out/", out+"/")

	goBin := goTool(t)
	const version, commit = "v0.0.0-deploytest", "0123456789abcdef0123456789abcdef01234567"
	// A bound, not a measure: on a machine whose build cache has never
	// seen CGO_ENABLED=0 and -trimpath, the step compiles the standard
	// library and every dependency again, and beside the rest of the
	// suite under -race that took over 10 minutes on 2 cores.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Dir = root(t)
	cmd.Env = append(os.Environ(),
		"PATH="+filepath.Dir(goBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"TARGETOS="+runtime.GOOS, "TARGETARCH="+runtime.GOARCH, "VERSION="+version, "COMMIT="+commit)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build step failed: %v\n%s\n%s", err, script, b)
	}

	for _, bin := range []string{"outbox-relay", "outbox-demo"} {
		path := filepath.Join(out, bin)
		f, err := elf.Open(path)
		if err != nil {
			t.Errorf("%s: %v", bin, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked; distroless/static needs a static binary (CGO_ENABLED=0)", bin)
				break
			}
		}
		if f.Section(".symtab") != nil {
			t.Errorf("%s has a symbol table: -ldflags \"-s -w\" did not apply", bin)
		}
		_ = f.Close()
	}

	var stdout bytes.Buffer
	cmd = exec.CommandContext(ctx, filepath.Join(out, "outbox-relay"), "version")
	cmd.Stdout = &stdout
	cmd.Stderr = &stdout
	if err := cmd.Run(); err != nil {
		t.Fatalf("outbox-relay version: %v\n%s", err, stdout.Bytes())
	}
	// The version without its "v", as the changelog and the image tag
	// name it.
	if !strings.HasPrefix(stdout.String(), "outbox-relay "+strings.TrimPrefix(version, "v")+" (commit "+commit+",") {
		t.Errorf("outbox-relay version printed %q: the -X ...cli.Version=${VERSION} and ...cli.Commit=${COMMIT} ldflags did not take", stdout.String())
	}
}

// dockerignore holds .dockerignore patterns with Docker's semantics: the
// last matching pattern wins, "!" re-includes, a pattern that matches a
// directory excludes everything below it.
type dockerignore []struct {
	re      *regexp.Regexp
	include bool
	raw     string
}

func parseDockerignore(t *testing.T, text string) dockerignore {
	t.Helper()
	var d dockerignore
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		raw := line
		include := strings.HasPrefix(line, "!")
		line = strings.TrimPrefix(line, "!")
		line = strings.TrimPrefix(filepath.ToSlash(filepath.Clean(line)), "/")
		if strings.ContainsAny(line, `[\`) {
			t.Fatalf(".dockerignore %q: character classes and escapes are not understood by this test; extend it", raw)
		}
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(line); i++ {
			switch {
			case strings.HasPrefix(line[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(line[i:], "**"):
				re.WriteString(".*")
				i++
			case line[i] == '*':
				re.WriteString("[^/]*")
			case line[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(line[i : i+1]))
			}
		}
		re.WriteString("$")
		d = append(d, struct {
			re      *regexp.Regexp
			include bool
			raw     string
		}{regexp.MustCompile(re.String()), include, raw})
	}
	return d
}

// excludedBy returns the pattern that keeps rel (slash-separated, relative
// to the context root) out of the build context, or "".
func (d dockerignore) excludedBy(rel string) string {
	by := ""
	for _, p := range d {
		matched := false
		for path := rel; ; {
			if p.re.MatchString(path) {
				matched = true
				break
			}
			i := strings.LastIndex(path, "/")
			if i < 0 {
				break
			}
			path = path[:i]
		}
		if matched {
			by = p.raw
			if p.include {
				by = ""
			}
		}
	}
	return by
}

func TestDockerignore(t *testing.T) {
	t.Parallel()
	ign := parseDockerignore(t, string(readFile(t, ".dockerignore")))
	for _, rel := range []string{".git/config", "bin/outbox-relay"} {
		if ign.excludedBy(rel) == "" {
			t.Errorf(".dockerignore does not exclude %s", rel)
		}
	}

	// Every file the Go build reads must reach the build context.
	need := []string{"go.mod", "go.sum"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(t), "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}}|{{.}}{{end}}{{range .EmbedFiles}}|{{.}}{{end}}{{end}}{{end}}`,
		"./cmd/outbox-relay", "./cmd/outbox-demo")
	cmd.Dir = root(t)
	b, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		parts := strings.Split(line, "|")
		dir, err := filepath.Rel(root(t), parts[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range parts[1:] {
			need = append(need, filepath.ToSlash(filepath.Join(dir, f)))
		}
	}
	if len(need) < 10 {
		t.Fatalf("go list found only %v; expected the sources of both commands", need)
	}
	for _, rel := range need {
		if by := ign.excludedBy(rel); by != "" {
			t.Errorf(".dockerignore pattern %q excludes %s, which the build needs", by, rel)
		}
	}
}

package doccheck

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, two levels above this package.
const root = "../../.."

// docs lists the Markdown files users read: the top-level pages, docs/,
// the Helm chart's README and the result files of bench/.
func docs(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, f := range []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"} {
		files = append(files, filepath.Join(root, f))
	}
	for _, dir := range []string{"docs", "deploy", "bench/results"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// prose returns the lines of a Markdown file outside fenced code blocks,
// with inline code removed (a link inside backticks is not a link).
func prose(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines = append(lines, "")
			continue
		}
		if fenced {
			lines = append(lines, "")
			continue
		}
		lines = append(lines, inlineCode.ReplaceAllString(line, "``"))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

var inlineCode = regexp.MustCompile("`[^`]*`")

// anchors returns the heading ids GitHub gives a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	seen := map[string]int{}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fenced := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		id := slug(strings.TrimLeft(line, "# "))
		if n := seen[id]; n > 0 {
			ids[id+"-"+itoa(n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

func itoa(n int) string {
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// slug is GitHub's heading id: lower case; letters, digits, '-' and '_'
// kept; spaces become '-'; everything else dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// Every relative link of the docs names a file that exists, and every
// anchor a heading of its target.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	cache := map[string]map[string]bool{}
	for _, file := range docs(t) {
		rel, _ := filepath.Rel(root, file)
		for i, line := range prose(t, file) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %s: no such file", rel, i+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				ids, ok := cache[dest]
				if !ok {
					ids = anchors(t, dest)
					cache[dest] = ids
				}
				if !ids[anchor] {
					t.Errorf("%s:%d: link %s: no heading with id %q", rel, i+1, target, anchor)
				}
			}
		}
	}
}

// The docs speak in the project's voice and state what is true now: no
// first person, and no section that describes behaviour from before a fix
// (that story belongs in CHANGELOG.md, which is not checked here).
func TestProjectVoice(t *testing.T) {
	t.Parallel()
	banned := regexp.MustCompile(`\bI (measured|would|tried|found|think|did)\b|Fixed\. The description|other people's|What I would`)
	for _, file := range docs(t) {
		rel, _ := filepath.Rel(root, file)
		if rel == "CHANGELOG.md" {
			continue
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			if m := banned.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: write in the project's voice, about what is true now", rel, i+1, m)
			}
		}
	}
}

// README.md is the front door: short enough to read, and the two
// commands it promises exist in the Makefile.
func TestREADMEIsAFrontDoor(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "\n"); n > 320 {
		t.Errorf("README.md has %d lines; keep it near 300 and move detail to the page that owns it", n)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"demo", "test", "build"} {
		if !strings.Contains(string(raw), "make "+target) {
			t.Errorf("README.md does not give `make %s`", target)
		}
		if !regexp.MustCompile(`(?m)^` + target + `:`).Match(mk) {
			t.Errorf("the Makefile has no %s target, which README.md gives", target)
		}
	}
}

// README.md and CONTRIBUTING.md say exactly which Debian packages
// `make test` may install: every package scripts/services.sh passes to
// apt_install (or to ensure_tool) is named in both, and every install is
// made without recommended packages.
func TestDocsListWhatServicesInstalls(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile(filepath.Join(root, "scripts", "services.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "apt-get install -y -qq --no-install-recommends") {
		t.Error("scripts/services.sh: apt_install no longer passes --no-install-recommends")
	}
	var pkgs []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:apt_install|install_without_service) ([a-z0-9 .+-]+)$`).FindAllStringSubmatch(string(script), -1) {
		pkgs = append(pkgs, strings.Fields(m[1])...)
	}
	for _, m := range regexp.MustCompile(`ensure_tool \S+ ([a-z0-9.+-]+)`).FindAllStringSubmatch(string(script), -1) {
		pkgs = append(pkgs, m[1])
	}
	if len(pkgs) < 5 {
		t.Fatalf("found only %v in scripts/services.sh: the test's patterns no longer match it", pkgs)
	}
	for _, doc := range []string{"README.md", "CONTRIBUTING.md"} {
		raw, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkgs {
			named := regexp.MustCompile("(^|[\\s`])" + regexp.QuoteMeta(p) + "([\\s`,;.)]|$)")
			if !named.Match(raw) {
				t.Errorf("%s does not name %s, which scripts/services.sh may install", doc, p)
			}
		}
	}
}

// docs/benchmarks.md owns every figure: the performance table of README.md
// is an excerpt of its current run, so every number in it appears in the
// "Current release" section of docs/benchmarks.md.
func TestREADMEFiguresAreTheBenchmarksOwn(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile(filepath.Join(root, "docs", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	current := string(bench)
	start := strings.Index(current, "## Current release")
	if start < 0 {
		t.Fatal(`docs/benchmarks.md has no "## Current release" section`)
	}
	current = current[start:]
	if end := strings.Index(current[3:], "\n## "); end >= 0 {
		current = current[:end+3]
	}
	perf := string(readme)
	start = strings.Index(perf, "## Performance")
	if start < 0 {
		t.Fatal(`README.md has no "## Performance" section`)
	}
	perf = perf[start:]
	if end := strings.Index(perf[3:], "\n## "); end >= 0 {
		perf = perf[:end+3]
	}
	number := regexp.MustCompile(`\b\d+\.\d+\b`)
	for _, line := range strings.Split(perf, "\n") {
		if !strings.HasPrefix(line, "| ") {
			continue
		}
		for _, n := range number.FindAllString(line, -1) {
			if !strings.Contains(current, n) {
				t.Errorf("README.md's performance table shows %s, which the current run in docs/benchmarks.md does not: %s", n, line)
			}
		}
	}
}

// Every test the docs name as the proof of a promise exists.
func TestNamedTestsExist(t *testing.T) {
	t.Parallel()
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(raw), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)`")
	for _, file := range docs(t) {
		rel, _ := filepath.Rel(root, file)
		if strings.HasPrefix(rel, "bench/results") || rel == "CHANGELOG.md" {
			continue // history may name tests that were renamed since
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				if !defined[m[1]] {
					t.Errorf("%s:%d: names %s, which no _test.go file defines", rel, i+1, m[1])
				}
			}
		}
	}
}

// Code that cites a section of the README or of a page in docs/
// (`README, "Section"`, `docs/x.md, "Section"`, or the same without
// quotes up to the closing parenthesis or the line's end) cites one that
// exists: the docs move, and a comment that points nowhere misleads.
func TestCodeCitesSectionsThatExist(t *testing.T) {
	cite := regexp.MustCompile(`(README|docs/[a-z0-9/_-]+\.md), (?:"([^"]+)"|([A-Z][^()"]*?))(?:\)|$)`)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		lines := strings.Split(string(raw), "\n")
		for i, line := range lines {
			// A citation may run over two comment lines.
			text := line
			if i+1 < len(lines) {
				text += " " + strings.TrimLeft(strings.TrimSpace(lines[i+1]), "/ ")
			}
			for _, m := range cite.FindAllStringSubmatch(text, -1) {
				page, section := m[1], strings.TrimSpace(m[2]+m[3])
				if page == "README" {
					page = "README.md"
				}
				if !anchors(t, filepath.Join(root, page))[slug(section)] {
					t.Errorf("%s:%d cites %s, %q: no such section", path, i+1, page, section)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

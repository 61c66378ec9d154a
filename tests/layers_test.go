package tests

import (
	"bufio"
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/kvstream/kvstream"

// docRow is one row of the package table in docs/ARCHITECTURE.md: a
// package and the packages of ours it may import, or "anything above" for
// the top of the stack.
type docRow struct {
	pkg     string
	lab     bool // its side column says "lab" (else "product")
	imports []string
	above   bool // "anything above": any package listed before it
}

// readPackageTable parses the "## Packages" table: rows whose first cell is
// a `package`, whose second says its side (product or lab) and whose last
// lists `imports`, "nothing", or "anything above".
func readPackageTable(t *testing.T, path string) []docRow {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	tick := regexp.MustCompile("`([^`]+)`")
	var rows []docRow
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		require.GreaterOrEqual(t, len(cells), 4, "package table row %q", line)
		pkg := tick.FindStringSubmatch(cells[0])
		require.NotNil(t, pkg, "package table row %q names no package", line)
		last := strings.TrimSpace(cells[len(cells)-1])
		r := docRow{pkg: pkg[1]}
		switch side := strings.TrimSpace(cells[1]); side {
		case "lab":
			r.lab = true
		case "product":
		default:
			t.Fatalf("package table row %q: side %q is neither product nor lab", line, side)
		}
		switch last {
		case "nothing":
		case "anything above":
			r.above = true
		default:
			for _, m := range tick.FindAllStringSubmatch(last, -1) {
				r.imports = append(r.imports, m[1])
			}
			require.NotEmpty(t, r.imports, "package table row %q: imports cell %q is neither a list nor \"nothing\"", line, last)
		}
		rows = append(rows, r)
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, rows, "no package table in %s", path)
	return rows
}

// testUpward lists the only tests allowed to import a package above their
// own, each with the reason.
var testUpward = map[[2]string]string{
	// The engine's end-to-end run on the C stand-in libcuda must run in the
	// driver's own test binary: TestCFakeLibcuda re-runs that binary with
	// the fake library first on LD_LIBRARY_PATH.
	{"hw/cuda/driver", "lab/gpucheck"}: "re-run under the fake libcuda",
	// system's examples (package system_test) run on simulated hardware, as
	// a user's program does: system.WithHardware(simulated.Hardware()).
	// simulated imports system, so it sits above it.
	{"system", "system/simulated"}: "the examples' hardware",
}

// goPackages lists every package of the module with its imports of ours
// (test files included: a test may not reach above its package either,
// but for testUpward).
func goPackages(t *testing.T, root string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "ucx", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	pkgs := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p struct {
			ImportPath                         string
			Imports, TestImports, XTestImports []string
		}
		require.NoError(t, dec.Decode(&p))
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "" {
			continue
		}
		seen := map[string]bool{}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if r, ok := strings.CutPrefix(imp, module+"/"); ok && r != rel && !seen[r] {
				seen[r] = true
				pkgs[rel] = append(pkgs[rel], r)
			}
		}
		sort.Strings(pkgs[rel])
		if _, ok := pkgs[rel]; !ok {
			pkgs[rel] = nil
		}
	}
	return pkgs
}

// TestEveryPackageSaysWhatItIsFor checks that every package of the module
// has a doc.go whose package comment names it ("Package x ..." or, for a
// program, "Command x ..."): one package, one purpose, said where a reader
// looks first.
func TestEveryPackageSaysWhatItIsFor(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	pkgs := goPackages(t, root)
	require.NotEmpty(t, pkgs)
	for pkg := range pkgs {
		path := filepath.Join(root, filepath.FromSlash(pkg), "doc.go")
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Errorf("package %s has no readable doc.go: %v", pkg, err)
			continue
		}
		name := f.Name.Name
		want := "Package " + name + " "
		if name == "main" {
			want = "Command " + filepath.Base(pkg) + " "
		}
		if f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), want) {
			t.Errorf("%s: its package comment must begin %q", path, want)
		}
	}
}

// TestLayersPointDown checks the package table of docs/ARCHITECTURE.md
// against the code: every package is in the table, imports exactly what its
// row says (non-test files), and only packages listed above it (test files
// too), so the doc and the code cannot drift and no layer reaches up.
func TestLayersPointDown(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	rows := readPackageTable(t, filepath.Join(root, "docs", "ARCHITECTURE.md"))
	all := goPackages(t, root)
	nonTest := nonTestImports(t, root)

	rank := map[string]int{}
	for i, r := range rows {
		_, dup := rank[r.pkg]
		require.False(t, dup, "package %s is listed twice", r.pkg)
		rank[r.pkg] = i
	}
	for pkg := range all {
		if _, ok := rank[pkg]; !ok && !strings.HasPrefix(pkg, "examples/") {
			t.Errorf("package %s is missing from the table in docs/ARCHITECTURE.md", pkg)
		}
	}
	for _, r := range rows {
		if r.lab != isLab(r.pkg) {
			t.Errorf("docs/ARCHITECTURE.md says %s is on the %s side; it lives on the other", r.pkg, map[bool]string{true: "lab", false: "product"}[r.lab])
		}
		imps, ok := all[r.pkg]
		if !ok {
			t.Errorf("docs/ARCHITECTURE.md lists %s, which does not exist", r.pkg)
			continue
		}
		for _, imp := range imps {
			at, known := rank[imp]
			if _, ok := testUpward[[2]string{r.pkg, imp}]; ok && !slices.Contains(nonTest[r.pkg], imp) {
				continue
			}
			if !known || at >= rank[r.pkg] {
				t.Errorf("%s imports %s, which is not listed above it", r.pkg, imp)
			}
		}
		if r.above {
			continue
		}
		want := slices.Clone(r.imports)
		sort.Strings(want)
		if got := nonTest[r.pkg]; !slices.Equal(got, want) {
			t.Errorf("%s imports %v; docs/ARCHITECTURE.md says %v", r.pkg, got, want)
		}
	}
	// A program that embeds only the decode server does not link the
	// prefill engine.
	for _, dep := range goDeps(t, root, "./decode") {
		if dep == "system" || dep == "actors" {
			t.Errorf("decode links %s: a decode-only program must not carry the prefill engine", dep)
		}
	}
	// The lab (what runs, measures and demonstrates the product: lab/, the
	// CLI, the cross-package tests, the examples) is never imported by the
	// product, nor linked by it through another package.
	for pkg, imps := range nonTest {
		if isLab(pkg) {
			continue
		}
		for _, imp := range imps {
			if isLab(imp) {
				t.Errorf("%s imports %s: the product never imports the lab", pkg, imp)
			}
		}
	}
	// A production engine links no simulated hardware: system/simulated
	// is the option that selects it.
	for _, dep := range goDeps(t, root, "./system") {
		if dep == "hw/cuda/sim" || dep == "hw/rdma/loopback" || isLab(dep) {
			t.Errorf("system links %s: the virtual GPU and the loopback live in system/simulated", dep)
		}
	}
	// Above the façade, only the replay (which drives the functional cores
	// themselves) reaches below it: the rest of the lab uses system's names.
	for pkg, imps := range nonTest {
		if !strings.HasPrefix(pkg, "lab/") || pkg == "lab/replay" {
			continue
		}
		for _, imp := range imps {
			if imp == "actors" || imp == "messages" || imp == "plan" {
				t.Errorf("%s imports %s: lab packages above the engine use the façade (system)", pkg, imp)
			}
		}
	}
	// The examples are what a user copies: only public packages.
	for pkg, imps := range all {
		if !strings.HasPrefix(pkg, "examples/") {
			continue
		}
		for _, imp := range imps {
			if strings.HasPrefix(imp, "internal/") || strings.Contains(imp, "/internal/") {
				t.Errorf("%s imports %s: an example must use public packages only", pkg, imp)
			}
		}
	}
}

// isLab reports whether a package is the lab's: what runs, measures,
// demonstrates or tests the product, never part of it.
func isLab(pkg string) bool {
	return strings.HasPrefix(pkg, "lab/") || strings.HasPrefix(pkg, "cmd/") || pkg == "tests" || strings.HasPrefix(pkg, "examples/")
}

// nonTestImports lists each package's imports of ours from its non-test
// files only.
func nonTestImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "ucx", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list")
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		rel := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		var ours []string
		for _, imp := range f[1:] {
			if r, ok := strings.CutPrefix(imp, module+"/"); ok {
				ours = append(ours, r)
			}
		}
		sort.Strings(ours)
		pkgs[rel] = ours
	}
	return pkgs
}

// goDeps lists the packages of this module that pkg links (its non-test
// dependencies, transitively), relative to the module.
func goDeps(t *testing.T, root, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list -deps %s", pkg)
	var deps []string
	for _, line := range strings.Fields(string(out)) {
		if r, ok := strings.CutPrefix(line, module+"/"); ok {
			deps = append(deps, r)
		}
	}
	require.NotEmpty(t, deps, "go list -deps %s", pkg)
	return deps
}

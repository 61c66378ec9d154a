package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeSnippet: every ```go block of README.md is an excerpt of this
// example's main.go, line for line (the file's lines one tab less
// indented), so the README's Go code is code that compiles (go build, go
// vet) and runs (TestEmbed), with no copy to drift from it.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	var file []string
	for l := range strings.Lines(string(src)) {
		file = append(file, strings.TrimPrefix(strings.TrimRight(l, "\n"), "\t"))
	}
	blocks := goBlocks(string(readme))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block")
	}
	for _, b := range blocks {
		if !excerpt(file, b.lines) {
			t.Errorf("README.md line %d: its ```go block is not an excerpt of examples/embed/main.go (one tab less indented); copy the lines from main.go:\n%s",
				b.line, strings.Join(b.lines, "\n"))
		}
	}
}

type goBlock struct {
	line  int // of the opening fence
	lines []string
}

// goBlocks returns the ```go blocks of a Markdown text.
func goBlocks(md string) []goBlock {
	var out []goBlock
	var cur *goBlock
	n := 0
	for l := range strings.Lines(md) {
		n++
		l = strings.TrimRight(l, "\n")
		switch {
		case cur == nil && l == "```go":
			out = append(out, goBlock{line: n})
			cur = &out[len(out)-1]
		case cur != nil && l == "```":
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// excerpt says whether want is a run of consecutive lines of file.
func excerpt(file, want []string) bool {
	if len(want) == 0 {
		return false
	}
	for i := 0; i+len(want) <= len(file); i++ {
		match := true
		for j, w := range want {
			if file[i+j] != w {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// TestExcerpt: a run of the file's lines is an excerpt; a changed line, a
// skipped line or lines out of order are not.
func TestExcerpt(t *testing.T) {
	file := []string{"a", "b", "c", "d"}
	for _, tc := range []struct {
		want []string
		ok   bool
	}{
		{[]string{"b", "c"}, true},
		{[]string{"a", "b", "c", "d"}, true},
		{[]string{"b", "x"}, false},
		{[]string{"a", "c"}, false},
		{[]string{"c", "b"}, false},
		{nil, false},
	} {
		if got := excerpt(file, tc.want); got != tc.ok {
			t.Errorf("excerpt(%q, %q) = %v, want %v", file, tc.want, got, tc.ok)
		}
	}
}

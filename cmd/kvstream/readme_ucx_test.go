//go:build ucx

package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeBlock is a shell block of README.md: its kvstream commands, and the
// output block that follows it, if any (what the README claims they print).
type readmeBlock struct {
	line     int
	commands []readmeCommand
	claims   []string
}

type readmeCommand struct {
	env        []string
	args       []string
	background bool
}

// readmeBlocks reads the ```sh blocks of README.md and the ``` block after
// each. A command is a line that runs kvstream (`go run ./cmd/kvstream ARGS`
// or `[VAR=value ...] ./kvstream ARGS [&]`); other lines (exports, make,
// builds) are not.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	defer f.Close()
	var blocks []readmeBlock
	var cur *readmeBlock
	inSh, inOut := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case l == "```sh":
			blocks = append(blocks, readmeBlock{line: n})
			cur, inSh = &blocks[len(blocks)-1], true
		case l == "```" && inSh:
			inSh = false
		case l == "```" && inOut:
			inOut, cur = false, nil
		case l == "```" && cur != nil:
			inOut = true
		case inSh:
			if c, ok := readmeCommandOf(l); ok {
				cur.commands = append(cur.commands, c)
			}
		case inOut:
			cur.claims = append(cur.claims, l)
		case strings.HasPrefix(l, "```"):
			cur = nil // a block of another language ends the claims
		case strings.TrimSpace(l) != "" && !inOut:
			cur = nil // prose between a command and an output block: not its output
		}
	}
	require.NoError(t, sc.Err())
	return blocks
}

func readmeCommandOf(l string) (readmeCommand, bool) {
	if i := strings.Index(l, "#"); i >= 0 {
		l = l[:i]
	}
	f := strings.Fields(l)
	var c readmeCommand
	for len(f) > 0 && strings.Contains(f[0], "=") {
		c.env, f = append(c.env, f[0]), f[1:]
	}
	switch {
	case len(f) >= 3 && f[0] == "go" && f[1] == "run" && f[2] == "./cmd/kvstream":
		f = f[3:]
	case len(f) >= 1 && f[0] == "./kvstream":
		f = f[1:]
	default:
		return c, false
	}
	if len(f) > 0 && f[len(f)-1] == "&" {
		c.background, f = true, f[:len(f)-1]
	}
	c.args = f
	return c, len(f) > 0
}

// claimPattern turns a claimed output line into a pattern: numbers with a
// fraction (times, rates) and addresses vary from run to run, whole numbers
// (requests, chunks, pages, tokens) and words do not; runs of spaces are
// layout.
func claimPattern(claim string) *regexp.Regexp {
	q := regexp.QuoteMeta(strings.TrimSpace(claim))
	q = regexp.MustCompile(`127\\\.0\\\.0\\\.1:\d+`).ReplaceAllString(q, `\S+`)
	q = regexp.MustCompile(`\d+\\\.\d+`).ReplaceAllString(q, `[0-9.]+`)
	q = regexp.MustCompile(`\s+`).ReplaceAllString(q, `\s+`)
	return regexp.MustCompile(q)
}

// readmeSkipped are the README's commands this test does not run, and the
// test that does.
var readmeSkipped = map[string]string{
	// 10 processes and etcd for half a minute, and more under -race: run
	// with fewer requests per batch by TestUCXClusterUp (and the README's
	// flags under load by hand, docs/RELIABILITY.md "Under load").
	"up": "TestUCXClusterUp",
}

// TestReadmeCommands runs every kvstream command of README.md as the README
// writes it (its environment, its flags, its background decode) and checks
// that each exits 0 and prints what the README claims: each claimed line,
// with times and rates free and every count as written.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	blocks := readmeBlocks(t)
	ran := 0
	for _, b := range blocks {
		if len(b.commands) == 0 {
			continue
		}
		var skip string
		for _, c := range b.commands {
			if s, ok := readmeSkipped[c.args[0]]; ok {
				skip = s
			}
		}
		if skip != "" {
			t.Logf("README line %d: %v runs in %s", b.line, b.commands[0].args, skip)
			continue
		}
		var procs []*cli
		for _, c := range b.commands {
			p := startCLI(t, c.env, c.args...)
			procs = append(procs, p)
			if c.background {
				// A background decode: the next command dials it, which a
				// prefill's --connect-timeout (10 s by default) waits for.
				continue
			}
		}
		var out strings.Builder
		for i, p := range procs {
			err := p.wait(t, 3*time.Minute)
			require.NoError(t, err, "README line %d: %v\nstdout:\n%s\nstderr:\n%s", b.line, b.commands[i].args, p.out(), p.errOut())
			out.WriteString(p.out())
			out.WriteString(p.errOut())
		}
		ran++
		for _, claim := range b.claims {
			if strings.TrimSpace(claim) == "" {
				continue
			}
			assert.Regexp(t, claimPattern(claim), out.String(), "README line %d claims %q", b.line, claim)
		}
	}
	assert.GreaterOrEqual(t, ran, 4, "the README's sim, generate and two-process blocks")
}

// TestClaimPattern: the pattern keeps counts and words, frees times, rates
// and addresses; a changed count fails it.
func TestClaimPattern(t *testing.T) {
	t.Parallel()
	p := claimPattern("decode: session of 127.0.0.1:41907 ended complete: 8 chunks, exposed 10.66 ms")
	assert.Regexp(t, p, "decode: session of 127.0.0.1:5 ended complete: 8 chunks, exposed 3.1 ms")
	assert.NotRegexp(t, p, "decode: session of 127.0.0.1:5 ended complete: 9 chunks, exposed 3.1 ms")
	assert.NotRegexp(t, p, "decode: session of 127.0.0.1:5 ended failed: 8 chunks, exposed 3.1 ms")
}

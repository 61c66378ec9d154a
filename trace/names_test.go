package trace

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestNamesRefuseControlCharacters: a name replay prints (an actor, an
// id, a type, a sender, the engine version) holding a control character
// (a NUL, a terminal escape, a newline, DEL, a C1 control) is refused
// naming the field and the line; kvstream replay printed them raw. Other
// characters, non-ASCII letters included, are names.
func TestNamesRefuseControlCharacters(t *testing.T) {
	for _, c := range []struct{ rec, want string }{
		{`{"seq":7,"actor":"chunk","id":"x\u0000y","type":"Timeout","msg":{}}`, `id "x\x00y": control character U+0000 at byte 1`},
		{`{"seq":7,"actor":"chunk","id":"\u001b]0;pwned\u0007","type":"Timeout","msg":{}}`, `id "\x1b]0;pwned\a": control character U+001B at byte 0`},
		{`{"seq":7,"actor":"chu\u001b[2Jnk","id":"x","type":"Timeout","msg":{}}`, `actor "chu\x1b[2Jnk": control character U+001B at byte 3`},
		{`{"seq":7,"actor":"chunk","id":"x","type":"Time\nout","msg":{}}`, `type "Time\nout": control character U+000A`},
		{`{"seq":7,"actor":"chunk","id":"x","type":"Timeout","sender":"a\u007f","msg":{}}`, `sender "a\x7f": control character U+007F at byte 1`},
		{`{"seq":7,"actor":"chunk","id":"\u009b31m","type":"Timeout","msg":{}}`, `id "\u009b31m": control character U+009B at byte 0`},
	} {
		rd, err := NewReader(strings.NewReader(testHeader + "\n" + c.rec + "\n"))
		require.NoError(t, err)
		_, err = rd.Next()
		require.Error(t, err, c.rec)
		assert.Contains(t, err.Error(), "trace line 2", c.rec)
		assert.Contains(t, err.Error(), c.want, c.rec)
	}
	rd, err := NewReader(strings.NewReader(testHeader + "\n" + `{"seq":7,"actor":"chunk","id":"décode-é","type":"Timeout","msg":{}}` + "\n"))
	require.NoError(t, err)
	_, err = rd.Next()
	require.NoError(t, err)

	hdr := strings.Replace(testHeader, `"engine_version":""`, `"engine_version":"v1\u001b[31m"`, 1)
	require.NotEqual(t, testHeader, hdr)
	_, err = NewReader(strings.NewReader(hdr + "\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `engine_version "v1\x1b[31m": control character U+001B at byte 2`)
}

// Name makes any string a name a trace holds: itself when it is one,
// else quoted and cut to MaxNameLen; whatever a caller hands the engine, its
// refused call's record reads back.
func TestNameIsAlwaysAName(t *testing.T) {
	assert.Equal(t, "d0", Name("d0"))
	assert.Equal(t, `"d\n"`, Name("d\n"))
	assert.Equal(t, `"\xff"`, Name("\xff"))
	long := Name(strings.Repeat("é", MaxNameLen))
	assert.LessOrEqual(t, len(long), MaxNameLen)
	assert.Contains(t, long, fmt.Sprintf("(%d bytes)", 2*MaxNameLen+2), "the cut says how long the quoted id was")
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		if rapid.Bool().Draw(t, "long") {
			s = strings.Repeat(s+"\x00", rapid.IntRange(1, 100).Draw(t, "times"))
		}
		n := Name(s)
		if err := checkName("name", n); err != nil {
			t.Fatalf("Name(%q) = %q: %v", s, n, err)
		}
		if checkName("", s) == nil && n != s {
			t.Fatalf("Name(%q) = %q changed a name a trace holds", s, n)
		}
	})
}

package decode

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeepAcceptedDropsOldestEnded: keepAccepted drops the oldest ended
// sessions first, only as many as the bound needs, never a live one, keeps
// the order, and clears the slots it emptied.
func TestKeepAcceptedDropsOldestEnded(t *testing.T) {
	mk := func(name string, ended bool) *Session {
		ss := &Session{done: make(chan struct{})}
		ss.info.Prefill = name
		if ended {
			ss.finish(SessionReport{}, nil)
		}
		return ss
	}
	names := func(l []*Session) []string {
		var out []string
		for _, ss := range l {
			out = append(out, ss.Prefill())
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		ended []bool
		max   int
		want  []string
	}{
		{"within the bound", []bool{true, true}, 2, []string{"s0", "s1"}},
		{"oldest ended first", []bool{false, true, true, true}, 2, []string{"s0", "s3"}},
		{"only as many as needed", []bool{true, false, true, false}, 3, []string{"s1", "s2", "s3"}},
		{"live ones all stay", []bool{false, false, false}, 1, []string{"s0", "s1", "s2"}},
		{"live ones stay, every ended one goes", []bool{true, false, true, false}, 1, []string{"s1", "s3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var list []*Session
			for i, e := range tc.ended {
				list = append(list, mk("s"+string(rune('0'+i)), e))
			}
			full := list[:len(list):len(list)]
			got := keepAccepted(list, tc.max)
			require.Equal(t, tc.want, names(got))
			for _, ss := range full[len(got):] {
				require.Nil(t, ss, "a dropped slot is cleared")
			}
		})
	}
}

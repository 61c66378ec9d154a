package netsec

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckHost: a certificate names IP addresses and RFC 1123 host names;
// a port, a space, a wildcard, a malformed IP address (all-digit last
// label) or an over-long label or name is refused, naming the value, and
// GenerateDevCerts then writes nothing. kvstream certs --hosts 1.2.3.4:80
// wrote "1.2.3.4:80" into every certificate as a DNS name.
func TestCheckHost(t *testing.T) {
	for _, h := range []string{"10.0.0.7", "::1", "fe80::1", "decode.example", "decode-0", "a", "x1.y-2.example", "node7", "3com.example",
		strings.Repeat("a", 63) + ".example"} {
		assert.NoError(t, CheckHost(h), h)
	}
	for _, h := range []string{"1.2.3.4:80", "a b", "*", "*.example", "999.1.1.1", "1.2.3", "", "-a.example", "a-.example", "a..b", ".a", "a.",
		"a_b", "décode", "a\x00b", "[::1]", strings.Repeat("a", 64) + ".example", strings.Repeat("a.", 127) + "ab"} {
		err := CheckHost(h)
		if assert.Error(t, err, "%q", h) {
			assert.Contains(t, err.Error(), "want an IP address or a host name", "%q", h)
			if len(h) < 60 {
				assert.Contains(t, err.Error(), fmt.Sprintf("host %q:", h), "names the value")
			}
		}
		dir := filepath.Join(t.TempDir(), "c")
		_, err = GenerateDevCerts(dir, []string{"n"}, []string{"10.0.0.7", h})
		require.Error(t, err, "%q", h)
		assert.Contains(t, err.Error(), "certs: host ")
		_, statErr := os.Stat(dir)
		assert.True(t, os.IsNotExist(statErr), "%q: nothing written", h)
	}
}

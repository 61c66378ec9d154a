package xferbench

import (
	"bufio"
	"bytes"
	"context"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/portlease"
)

// UCX's own benchmark, run beside the transport's runs: `ucx_perftest -t
// ucp_put_bw` with the same message size, iterations and environment
// (UCX_TLS and the other UCX_* variables pass through), a server and a
// client process on 127.0.0.1, as docs/TRANSPORT-BENCH.md compares.

// PerftestBuffers are the buffer kinds ucx_perftest runs with: its default
// (buffers UCX allocates, which a same-host peer maps) and buffers UCX
// cannot export (UCX_ALLOC_PRIO=mmap,heap), the case of memory a caller
// registers.
var PerftestBuffers = []struct{ Name, AllocPrio string }{
	{"default", ""},
	{"mmap,heap", "mmap,heap"},
}

// perftestRun is one ucx_perftest run.
type perftestRun struct {
	path      string
	allocPrio string // UCX_ALLOC_PRIO for both processes; "" leaves the environment's
	size      uint64
	count     int
	warmup    int
}

// maxPerftestStarts bounds the client's attempts to reach a server that is
// still starting (it exits at once when its connect is refused).
const maxPerftestStarts = 50

// run starts the server, then the client (again while the server is not
// listening yet), and returns the bandwidth the client reports, in bytes
// per second.
func (p perftestRun) run(ctx context.Context) (float64, error) {
	env := os.Environ()
	if p.allocPrio != "" {
		env = append(env, "UCX_ALLOC_PRIO="+p.allocPrio)
	}
	for attempt := 0; ; attempt++ {
		// The server's port is held for it (ucx_perftest binds it with
		// SO_REUSEADDR) until it exited: no other bind or connection is
		// given it meanwhile.
		lease, err := portlease.Take("127.0.0.1", true)
		if err != nil {
			return 0, errors.Wrap(err, "a port for ucx_perftest")
		}
		srv := exec.CommandContext(ctx, p.path, "-p", strconv.Itoa(lease.Port))
		srv.Env = env
		var srvOut bytes.Buffer
		srv.Stdout, srv.Stderr = &srvOut, &srvOut
		if err := srv.Start(); err != nil {
			lease.Release()
			return 0, errors.Wrapf(err, "start %s (the ucx-utils package has it)", p.path)
		}
		bps, refused, err := p.client(ctx, env, lease.Port)
		if err != nil || refused {
			_ = srv.Process.Kill()
		}
		werr := srv.Wait()
		lease.Release()
		switch {
		case refused && attempt < maxPerftestStarts && ctx.Err() == nil:
			time.Sleep(20 * time.Millisecond) // the server was not listening yet
			continue
		case err != nil:
			return 0, errors.Wrapf(err, "ucx_perftest server said: %s", tail(srvOut.String()))
		case werr != nil:
			return 0, errors.Wrapf(werr, "ucx_perftest server: %s", tail(srvOut.String()))
		}
		return bps, nil
	}
}

// client runs the client and parses its CSV line; refused reports a server
// not listening yet.
func (p perftestRun) client(ctx context.Context, env []string, port int) (bps float64, refused bool, err error) {
	args := []string{"127.0.0.1", "-p", strconv.Itoa(port), "-t", "ucp_put_bw", "-s", strconv.FormatUint(p.size, 10),
		"-n", strconv.Itoa(p.count), "-w", strconv.Itoa(p.warmup), "-f", "-v"}
	cmd := exec.CommandContext(ctx, p.path, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("Connection refused")) {
			return 0, true, nil
		}
		return 0, false, errors.Wrapf(err, "%s %s: %s", p.path, strings.Join(args, " "), tail(string(out)))
	}
	bps, err = parsePerftest(out, p.size)
	if err != nil {
		return 0, false, errors.Wrapf(err, "%s %s", p.path, strings.Join(args, " "))
	}
	return bps, false, nil
}

// parsePerftest reads the CSV that `ucx_perftest -f -v` prints (a header
// line starting "iterations," and one line of figures) and returns the
// overall bandwidth (its overall_bw column, in MiB/s) in bytes per second.
// The overall message rate times the size must agree with it, which checks
// that the columns are what they are taken for.
func parsePerftest(out []byte, size uint64) (float64, error) {
	var header []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "iterations,") {
			header = strings.Split(line, ",")
			continue
		}
		if header == nil || line == "" || line[0] < '0' || line[0] > '9' {
			continue
		}
		fields := strings.Split(line, ",")
		if len(fields) != len(header) {
			return 0, errors.Newf("ucx_perftest printed %d figures under %d headings: %q", len(fields), len(header), line)
		}
		col := map[string]float64{}
		for i, h := range header {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return 0, errors.Newf("ucx_perftest figure %q (%s): not a number", fields[i], h)
			}
			col[h] = v
		}
		mr, okMR := col["overall_mr"]
		bw, okBW := col["overall_bw"]
		if !okMR || !okBW || mr <= 0 {
			return 0, errors.Newf("ucx_perftest printed no overall_mr/overall_bw: %q", line)
		}
		// The bandwidth has two decimals; the message rate is rounded to
		// whole messages per second, which at a few messages per second
		// (4 MiB over TCP) is a few percent: allow that, and 1% besides.
		bps := bw * (1 << 20)
		if d := mr*float64(size) - bps; math.Abs(d) > 0.5*float64(size)+0.01*bps {
			return 0, errors.Newf("ucx_perftest's rate (%v msg/s × %d B) and bandwidth (%v MiB/s) disagree", mr, size, bw)
		}
		return bps, nil
	}
	return 0, errors.Newf("no figures in ucx_perftest's output: %s", tail(string(out)))
}

// tail is the end of a process's output, for an error message.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return s
}

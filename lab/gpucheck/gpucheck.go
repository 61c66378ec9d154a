package gpucheck

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// Options size the check.
type Options struct {
	Layers, HookLayers, GroupSize int
	ItemLen                       int // bytes per page per buffer
	Pages                         int // pages per request
	Requests                      int
	PageSize                      int
}

// Defaults: an MLA-like pool of 16 layers (15 fire a hook), 4 requests.
func Defaults() Options {
	return Options{Layers: 16, HookLayers: 15, GroupSize: 4, ItemLen: 64 * 1152, Pages: 32, Requests: 4, PageSize: 64}
}

// Report is what a check found.
type Report struct {
	Device     string
	Chunks     int
	Bytes      uint64
	BytesEqual bool
	Mismatch   string
	Elapsed    time.Duration
	RecordP50  time.Duration // cuEventRecord through the driver backend
	QueryP50   time.Duration // cuEventQuery on a completed event
}

// String is the one-line report.
func (r Report) String() string {
	s := fmt.Sprintf("gpu check on %s: %d chunks, %d bytes from device memory, bytes equal: %v, in %v; event record p50 %v, query p50 %v",
		r.Device, r.Chunks, r.Bytes, r.BytesEqual, r.Elapsed.Round(time.Millisecond), r.RecordP50, r.QueryP50)
	if r.Mismatch != "" {
		s += "; first mismatch: " + r.Mismatch
	}
	return s
}

// value is the byte the kernel of (room, buffer, position) writes.
func value(room uint64, b, pos int) byte { return byte(room*31 + uint64(b)*7 + uint64(pos)*13 + 1) }

// Run runs the check on dev.
func Run(ctx context.Context, dev *driver.Device, o Options) (Report, error) {
	rep := Report{Device: fmt.Sprintf("%s (device %d)", dev.Name(), dev.Ordinal())}
	per := o.ItemLen * o.Pages * o.Requests // one buffer
	bases := make([]uint64, o.Layers)
	for b := range bases {
		p, err := dev.Alloc(per)
		if err != nil {
			return rep, errors.Wrapf(err, "device pool buffer %d", b)
		}
		defer dev.Free(p) //nolint:errcheck
		bases[b] = uint64(p)
	}
	fab := loopback.NewFabric(loopback.Options{ReadDevice: func(dst []byte, src uint64) error {
		return dev.CopyDtoH(dst, driver.DevicePtr(src))
	}})
	pre, err := fab.NewTransport("gpu-prefill")
	if err != nil {
		return rep, err
	}
	defer pre.Close()
	dec, err := fab.NewTransport("decode")
	if err != nil {
		return rep, err
	}
	defer dec.Close()
	geom := testbed.MLA(o.Layers, uint64(o.ItemLen), o.Pages*o.Requests)
	decode, err := testbed.NewDecode(dec, geom)
	if err != nil {
		return rep, err
	}
	defer decode.Free()
	bufs := system.MLABuffers(bases, uint64(o.ItemLen), o.Pages*o.Requests)
	for i := range bufs {
		bufs[i].Memory = rdma.MemoryCUDA // device memory: the transport registers it as such
	}
	eng, err := system.New(system.Config{Buffers: bufs,
		HookLayers: o.HookLayers, GroupSize: o.GroupSize, PageSize: o.PageSize},
		system.WithGPU(dev, nil), system.WithTransport(pre), system.WithLogger(zap.NewNop()))
	if err != nil {
		return rep, err
	}
	defer eng.Close()
	if err := eng.AddPeer(decode.Peer("decode")); err != nil {
		return rep, err
	}
	stream, ok := eng.Stream().(*driver.Stream)
	if !ok {
		return rep, errors.AssertionFailedf("WithGPU gave a %T stream", eng.Stream())
	}

	start := time.Now()
	src := func(r, pos int) int { return r*o.Pages + pos }
	dst := func(r, pos int) int { return (o.Requests-1-r)*o.Pages + pos } // other pages than the source
	for r := 0; r < o.Requests; r++ {
		dstPages := make([]int, o.Pages)
		srcPages := make([]int, o.Pages)
		for x := range dstPages {
			srcPages[x], dstPages[x] = src(r, x), dst(r, x)
		}
		if _, err := eng.Register(ctx, system.ChunkSpec{Room: uint64(r), End: o.Pages * o.PageSize, Last: true, SrcPages: srcPages,
			TotalPages: o.Pages, Infos: []system.DecodeInfo{{Peer: "decode", DstPages: dstPages}}}); err != nil {
			return rep, err
		}
	}
	fw, err := eng.BeginForward()
	if err != nil {
		return rep, err
	}
	for l := 0; l < o.Layers; l++ {
		for r := 0; r < o.Requests; r++ {
			for x := 0; x < o.Pages; x++ {
				addr := bases[l] + uint64(src(r, x)*o.ItemLen)
				if err := stream.MemsetD8Async(driver.DevicePtr(addr), value(uint64(r), l, x), o.ItemLen); err != nil {
					return rep, errors.Wrapf(err, "layer %d kernel", l)
				}
			}
		}
		if l < o.HookLayers {
			if err := fw.LayerEnd(l); err != nil {
				return rep, err
			}
		}
	}
	if err := fw.End(); err != nil {
		return rep, err
	}
	for r := 0; r < o.Requests; r++ {
		res, err := eng.Finish(ctx, uint64(r))
		if err != nil {
			return rep, errors.Wrapf(err, "finish room %d", r)
		}
		rep.Chunks++
		rep.Bytes += res.Stats.Bytes
	}
	rep.Elapsed = time.Since(start)
	rep.BytesEqual = true
	for r := 0; r < o.Requests && rep.Mismatch == ""; r++ {
		for l := 0; l < o.Layers && rep.Mismatch == ""; l++ {
			for x := 0; x < o.Pages; x++ {
				page, want := decode.Page(l, dst(r, x)), value(uint64(r), l, x)
				for i, got := range page {
					if got != want {
						rep.Mismatch = fmt.Sprintf("room %d layer %d position %d byte %d: %d, want %d", r, l, x, i, got, want)
						break
					}
				}
				if rep.Mismatch != "" {
					break
				}
			}
		}
	}
	rep.BytesEqual = rep.Mismatch == ""
	rep.RecordP50, rep.QueryP50 = eventCosts(stream)
	return rep, nil
}

// eventCosts times 1000 event records and queries on an idle stream.
func eventCosts(s *driver.Stream) (record, query time.Duration) {
	const n = 1000
	rec, q := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		ev, err := s.Record()
		rec = append(rec, time.Since(t0))
		if err != nil {
			break
		}
		_ = ev.Wait(context.Background())
		t1 := time.Now()
		_, _ = ev.Query()
		q = append(q, time.Since(t1))
	}
	return p50(rec), p50(q)
}

func p50(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
	return xs[len(xs)/2]
}

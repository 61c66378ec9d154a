//go:build ucx

package main

import (
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
)

func init() {
	transports["ucx"] = func(name string, o transportOpts) (rdma.Transport, error) {
		// UCX's tcp transport listens on every interface it may use: keep
		// it on the control plane's (or --data-addr's).
		opts := ucx.Options{Name: name, CloseDrain: time.Second}
		if o.writes != "" {
			w, err := ucx.ParseWriteMode(o.writes)
			if err != nil {
				return nil, errors.Wrap(err, "--ucx-writes")
			}
			opts.Writes = w
		}
		if o.dataHost != "" {
			devs, err := netDevices(o.dataHost)
			if err != nil {
				return nil, err
			}
			opts.Config = map[string]string{"NET_DEVICES": devs}
		}
		// The drain bound fits inside the engine's teardown reserve (a tenth
		// of the finish timeout, at most 1 s).
		return ucx.New(opts)
	}
}

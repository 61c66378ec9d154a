//go:build ucx

package main

import (
	"time"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
)

func init() {
	transports["ucx"] = func(name, dataHost string) (rdma.Transport, error) {
		// UCX's tcp transport listens on every interface it may use: keep
		// it on the control plane's (or --data-addr's).
		opts := ucx.Options{Name: name, CloseDrain: time.Second}
		if dataHost != "" {
			devs, err := netDevices(dataHost)
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

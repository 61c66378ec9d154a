//go:build ucx

package main

import (
	"time"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
)

func init() {
	transports["ucx"] = func(name string) (rdma.Transport, error) {
		// The drain bound fits inside the engine's teardown reserve (a tenth
		// of the finish timeout, at most 1 s).
		return ucx.New(ucx.Options{Name: name, CloseDrain: time.Second})
	}
}

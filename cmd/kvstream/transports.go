package main

import (
	"sort"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// transportFactory opens one side of a transport by name. loopback is
// always built in; ucx registers itself when the binary is built with
// -tags ucx (it needs cgo and libucx).
type transportFactory func(name string) (rdma.Transport, error)

var transports = map[string]transportFactory{
	"loopback": func(name string) (rdma.Transport, error) { return loopback.Default().NewTransport(name) },
}

// openTransport opens a transport of the given kind, or says which kinds
// this binary has.
func openTransport(kind, name string) (rdma.Transport, error) {
	f, ok := transports[kind]
	if !ok {
		var have []string
		for k := range transports {
			have = append(have, k)
		}
		sort.Strings(have)
		hint := ""
		if kind == "ucx" {
			hint = " (this binary was built without UCX: go build -tags ucx ./cmd/kvstream, with libucx-dev installed)"
		}
		return nil, errors.Newf("--transport %q: this binary has %s%s", kind, strings.Join(have, ", "), hint)
	}
	return f(name)
}

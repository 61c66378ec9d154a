//go:build ucx

package buildinfo

import "github.com/kvstream/kvstream/hw/rdma/ucx"

func ucxVersions() (built, run string) { return ucx.BuiltVersion(), ucx.RuntimeVersion() }

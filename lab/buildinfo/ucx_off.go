//go:build !ucx

package buildinfo

func ucxVersions() (built, run string) { return NoUCX, NoUCX }

//go:build ucx

package ucx

/*
#cgo pkg-config: ucx
#include <ucp/api/ucp.h>
*/
import "C"

import "fmt"

// BuiltVersion is the UCX API version this package was compiled against
// (UCP_API_MAJOR.UCP_API_MINOR of the headers; the headers carry no
// release number).
func BuiltVersion() string { return fmt.Sprintf("%d.%d", C.UCP_API_MAJOR, C.UCP_API_MINOR) }

// RuntimeVersion is the version of the libucp this process runs with
// (ucp_get_version: major.minor.release), which may differ from
// BuiltVersion when the library was upgraded under the binary.
func RuntimeVersion() string {
	var major, minor, release C.uint
	C.ucp_get_version(&major, &minor, &release)
	return fmt.Sprintf("%d.%d.%d", major, minor, release)
}

package driver

import (
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/cuda"
)

// Result is a CUresult, the status every driver API call returns.
type Result int32

// CUresult values the package itself branches on.
const (
	Success           Result = 0   // CUDA_SUCCESS
	ErrorInvalidValue Result = 1   // CUDA_ERROR_INVALID_VALUE
	ErrorNoDevice     Result = 100 // CUDA_ERROR_NO_DEVICE
	ErrorNotReady     Result = 600 // CUDA_ERROR_NOT_READY: not an error, "not yet"
)

// resultNames is the fallback for when the driver cannot name a code
// (library absent, or cuGetErrorName failed). Source: enum CUresult of
// cuda.h as published in the CUDA 12.8-13.x driver API reference.
var resultNames = map[Result]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	5:   "CUDA_ERROR_PROFILER_DISABLED",
	6:   "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7:   "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8:   "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	36:  "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED",
	206: "CUDA_ERROR_UNMAP_FAILED",
	207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED",
	211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
	213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
	806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
	808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
	810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED",
	812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE",
	913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE",
	915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION",
	999: "CUDA_ERROR_UNKNOWN",
}

// String returns the code's CUDA_* name from the built-in table, or
// "CUDA_ERROR_<n>" for a code newer than the table.
func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int32(r))
}

// DeviceLost reports whether the code leaves the context (and every stream,
// event and allocation in it) unusable, so that the process must stop using
// the device: the engine escalates these instead of failing one chunk.
//
// The set is the codes the driver API reference documents as "leaves the
// process in an inconsistent state ... the process must be terminated and
// relaunched" (226, 700, 702, 710, 714-719, 721, 810, 911), the hardware
// faults that invalidate memory (214 ECC, 220 NVLink), and codes saying the
// context or the driver is gone (3, 4, 46, 201, 709). 201 INVALID_CONTEXT is
// included because every call here runs with the primary context made
// current first, so it can only mean that the context was reset or destroyed
// underneath us. 999 UNKNOWN is included to fail closed: nothing says the
// context is still sane after an internal driver error.
func (r Result) DeviceLost() bool {
	switch r {
	case 3, 4, 46, 201, 709, // driver or context gone
		214, 220, 226, // uncorrectable ECC/NVLink, contained hardware error
		700, 702, 710, 714, 715, 716, 717, 718, 719, 721, // sticky kernel faults
		810, 911, 999: // MPS client killed, external device error, unknown
		return true
	}
	return false
}

// Error is a failed driver call.
type Error struct {
	// Op is the driver entry point that failed, e.g. "cuEventRecord".
	Op string
	// Code is the CUresult it returned.
	Code Result
	// Name is the code's CUDA_* name, from the driver when it knows it.
	Name string
	// Desc is the driver's description of the code; may be empty.
	Desc string
}

// Error formats as "cuEventRecord: CUDA_ERROR_INVALID_HANDLE (400): invalid
// resource handle".
func (e *Error) Error() string {
	if e.Desc == "" {
		return fmt.Sprintf("%s: %s (%d)", e.Op, e.Name, int32(e.Code))
	}
	return fmt.Sprintf("%s: %s (%d): %s", e.Op, e.Name, int32(e.Code), e.Desc)
}

// newError describes a failed call, naming the code through the driver when
// it is loaded (it knows codes newer than the table), and marks it with
// cuda.ErrDeviceLost when the context is unusable. a may be nil.
func newError(a *api, op string, r Result) error {
	e := &Error{Op: op, Code: r, Name: r.String()}
	if a != nil {
		if n := a.errorName(r); n != "" {
			e.Name = n
		}
		e.Desc = a.errorString(r)
	}
	var err error = e
	if r.DeviceLost() {
		err = errors.Mark(err, cuda.ErrDeviceLost)
	}
	return errors.WithStackDepth(err, 1)
}

// Code returns the CUresult carried by err (anywhere in its chain), or
// (0, false) when err is not a driver failure.
func Code(err error) (Result, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return 0, false
}

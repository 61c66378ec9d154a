package cp

// Mode says how a room's KV goes to decode.
type Mode int

const (
	// Monolithic sends every buffer of a chunk to every non-dummy decode
	// destination after the forward. It is the reference for byte equality
	// and the fallback.
	Monolithic Mode = iota
	// PerLayer streams groups of layers while the forward runs.
	PerLayer
)

// String returns a readable mode name.
func (m Mode) String() string {
	if m == PerLayer {
		return "per-layer"
	}
	return "monolithic"
}

// Reason says why the guard chose a mode.
type Reason int

const (
	// OneDestination: exactly one non-dummy destination, per-layer allowed.
	OneDestination Reason = iota
	// SeveralDestinations: more than one non-dummy destination; per-layer
	// contexts are built for one destination, so the room goes monolithic
	// (which fans out to all of them).
	SeveralDestinations
	// AllDummy: no destination receives anything.
	AllDummy
	// PerLayerOff: one destination, but per-layer streaming is switched off
	// by configuration.
	PerLayerOff
)

// String returns a readable reason, used in logs and metric labels.
func (r Reason) String() string {
	switch r {
	case OneDestination:
		return "one_destination"
	case SeveralDestinations:
		return "several_destinations"
	case AllDummy:
		return "all_dummy"
	case PerLayerOff:
		return "per_layer_off"
	}
	return "unknown"
}

// Guard is the register guard (invariant 8): per-layer streaming serves a
// room with exactly one non-dummy destination; anything else is monolithic.
// dummy[i] tells whether destination i is a dummy. real is the index of the
// single real destination, or -1.
func Guard(dummy []bool) (mode Mode, reason Reason, real int) {
	real, n := -1, 0
	for i, d := range dummy {
		if !d {
			n++
			real = i
		}
	}
	switch n {
	case 0:
		return Monolithic, AllDummy, -1
	case 1:
		return PerLayer, OneDestination, real
	}
	return Monolithic, SeveralDestinations, -1
}

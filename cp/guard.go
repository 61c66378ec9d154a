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

// Policy says which rooms stream per layer.
type Policy int

const (
	// EveryDestination streams a room per layer to each of its real
	// destinations, however many (the default): each group's work carries
	// every destination's writes, one batch per destination.
	EveryDestination Policy = iota
	// SingleDestination is the reference rule: per-layer streaming only for
	// a room with exactly one real destination; a room with several goes
	// monolithic.
	SingleDestination
	// NoPerLayer sends every room monolithically after the forward.
	NoPerLayer
)

// String returns the policy's name.
func (p Policy) String() string {
	switch p {
	case EveryDestination:
		return "every_destination"
	case SingleDestination:
		return "single_destination"
	case NoPerLayer:
		return "no_per_layer"
	}
	return "unknown"
}

// Reason says why the guard chose a mode. It describes the room's
// destinations (one, several, none) unless the policy overrode them.
type Reason int

const (
	// OneDestination: exactly one real destination; per-layer.
	OneDestination Reason = iota
	// SeveralDestinations: more than one real destination; per-layer to
	// each under EveryDestination, monolithic (which fans out to all of
	// them) under SingleDestination.
	SeveralDestinations
	// AllDummy: no destination receives anything from this rank: every one
	// is a dummy (or, with resharding, routes nothing from this rank).
	AllDummy
	// PerLayerOff: at least one real destination, but per-layer streaming
	// is switched off by configuration (NoPerLayer).
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

// Guard is the register guard (invariant 8). dummy[i] tells whether
// destination i receives nothing (a dummy). With no real destination there
// is nothing to send (monolithic, AllDummy); otherwise the policy decides:
// EveryDestination streams per layer to all of them, SingleDestination only
// to exactly one (several go monolithic), NoPerLayer never. real is the
// index of the single real destination, or -1.
func Guard(dummy []bool, policy Policy) (mode Mode, reason Reason, real int) {
	real, n := -1, 0
	for i, d := range dummy {
		if !d {
			n++
			real = i
		}
	}
	if n != 1 {
		real = -1
	}
	switch {
	case n == 0:
		return Monolithic, AllDummy, -1
	case policy == NoPerLayer:
		return Monolithic, PerLayerOff, real
	case n == 1:
		return PerLayer, OneDestination, real
	case policy == SingleDestination:
		return Monolithic, SeveralDestinations, -1
	}
	return PerLayer, SeveralDestinations, -1
}

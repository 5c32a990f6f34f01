package backup

import "time"

// SetPlacementRefusedHook sets the hook called when a restore request is
// refused for want of peers and will be sent again; the returned func
// removes it. wait replaces placementWait meanwhile.
func SetPlacementRefusedHook(f func(stream string), wait time.Duration) func() {
	testHookPlacementRefused, placementWait = f, wait
	return func() { testHookPlacementRefused, placementWait = nil, 30*time.Second }
}

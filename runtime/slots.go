package runtime

import "fmt"

// PlanSlots lays out a node's slots: count of them, or (count 0) as many
// as memoryBudget holds at slotMemory each; the last spot of them are
// spot capacity, the rest on-demand.
func PlanSlots(count int, memoryBudget, slotMemory int64, spot int) ([]Class, error) {
	if count == 0 && slotMemory > 0 {
		count = int(memoryBudget / slotMemory)
	}
	switch {
	case count < 1:
		return nil, fmt.Errorf("plan slots: no slot fits (count %d, memory budget %d, slot memory %d)", count, memoryBudget, slotMemory)
	case spot < 0 || spot > count:
		return nil, fmt.Errorf("plan slots: %d spot slots of %d", spot, count)
	}
	slots := make([]Class, count)
	for i := range slots {
		slots[i] = OnDemand
		if i >= count-spot {
			slots[i] = Spot
		}
	}
	return slots, nil
}

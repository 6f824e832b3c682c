// Command allocator-harness runs the upstream structured allocator
// (k8s.io/dynamic-resource-allocation/structured, the code kube-scheduler uses)
// on a conformance scenario and prints the outcome as JSON.
//
// Usage:
//
//	allocator-harness [-mode allocate|place] [FILE]   (FILE "-" or absent: stdin)
//
// The scenario format and both output shapes are documented in tools/kube/README.md.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	resourcedefaults "k8s.io/kubernetes/pkg/apis/resource/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// nodeSpec is the scenario's description of a node.
type nodeSpec struct {
	Name             string            `json:"name"`
	Labels           map[string]string `json:"labels,omitempty"`
	DeclaredFeatures []string          `json:"declaredFeatures,omitempty"`
}

type scenario struct {
	Name      string
	Features  []string
	Node      *nodeSpec
	Nodes     []nodeSpec
	Classes   []*resourceapi.DeviceClass
	Slices    []*resourceapi.ResourceSlice
	Allocated []*resourceapi.ResourceClaim
	Claims    []*resourceapi.ResourceClaim
}

type allocateOutput struct {
	Name    string                          `json:"name"`
	Error   string                          `json:"error"`
	Results []*resourceapi.AllocationResult `json:"results"`
}

type placement struct {
	Claim      string                        `json:"claim"`
	Node       *string                       `json:"node"`
	Result     *resourceapi.AllocationResult `json:"result"`
	Error      string                        `json:"error"`
	NodesTried int                           `json:"nodesTried"`
	Seconds    float64                       `json:"seconds"`
}

type placeOutput struct {
	Name         string                          `json:"name"`
	Error        string                          `json:"error"`
	Results      []*resourceapi.AllocationResult `json:"results"`
	Placements   []placement                     `json:"placements"`
	Placed       int                             `json:"placed"`
	TotalSeconds float64                         `json:"totalSeconds"`
}

// classLister serves the scenario's DeviceClasses in input order. Get returns the
// same NotFound error as the generated informer lister kube-scheduler uses.
type classLister struct{ classes []*resourceapi.DeviceClass }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l.classes, nil }

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l.classes {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: resourceapi.GroupName, Resource: "deviceclass"}, name)
}

// knownFeatures maps the field names of structured.Features (as written in scenarios)
// to the struct field index, discovered by reflection so that every field of the
// pinned k8s.io/dynamic-resource-allocation version is accepted.
func knownFeatures() map[string]int {
	t := reflect.TypeOf(structured.Features{})
	out := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Type.Kind() == reflect.Bool {
			out[t.Field(i).Name] = i
		}
	}
	return out
}

func parseFeatures(names []string) (structured.Features, error) {
	var f structured.Features
	known := knownFeatures()
	v := reflect.ValueOf(&f).Elem()
	for i, name := range names {
		idx, ok := known[name]
		if !ok {
			valid := make([]string, 0, len(known))
			for k := range known {
				valid = append(valid, k)
			}
			sort.Strings(valid)
			return f, fmt.Errorf("features[%d]: unknown allocator feature %q; valid names (fields of structured.Features): %s", i, name, strings.Join(valid, ", "))
		}
		v.Field(idx).SetBool(true)
	}
	return f, nil
}

// decodeStrict decodes one JSON value into out, rejecting unknown fields, and
// prefixes errors with the scenario path of the value.
func decodeStrict(path string, raw json.RawMessage, out any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func decodeList[T any](path string, raw json.RawMessage) ([]*T, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%s: must be a list: %w", path, err)
	}
	out := make([]*T, 0, len(items))
	for i, item := range items {
		obj := new(T)
		if err := decodeStrict(fmt.Sprintf("%s[%d]", path, i), item, obj); err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return out, nil
}

// applyDefaults applies the API server's defaulting for resource.k8s.io/v1
// (k8s.io/kubernetes/pkg/apis/resource/v1, e.g. allocationMode ExactCount, count 1,
// toleration operator Equal, taint timeAdded): kube-scheduler only ever sees defaulted
// objects.
func applyDefaults(s *scenario) {
	for _, c := range s.Allocated {
		resourcedefaults.SetObjectDefaults_ResourceClaim(c)
	}
	for _, c := range s.Claims {
		resourcedefaults.SetObjectDefaults_ResourceClaim(c)
	}
	for _, sl := range s.Slices {
		resourcedefaults.SetObjectDefaults_ResourceSlice(sl)
	}
}

func parseScenario(data []byte) (*scenario, error) {
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("scenario is not valid YAML: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(jsonData, &top); err != nil {
		return nil, fmt.Errorf("scenario must be a YAML mapping at the top level: %w", err)
	}
	known := sets.New("name", "features", "node", "nodes", "classes", "slices", "allocated", "claims", "expect")
	for key := range top {
		if !known.Has(key) {
			fmt.Fprintf(os.Stderr, "allocator-harness: ignoring unknown top-level key %q\n", key)
		}
	}
	s := &scenario{}
	if raw, ok := top["name"]; ok {
		if err := decodeStrict("name", raw, &s.Name); err != nil {
			return nil, err
		}
	}
	if raw, ok := top["features"]; ok {
		if err := decodeStrict("features", raw, &s.Features); err != nil {
			return nil, err
		}
	}
	if raw, ok := top["node"]; ok && string(raw) != "null" {
		s.Node = &nodeSpec{}
		if err := decodeStrict("node", raw, s.Node); err != nil {
			return nil, err
		}
	}
	if raw, ok := top["nodes"]; ok {
		if err := decodeStrict("nodes", raw, &s.Nodes); err != nil {
			return nil, err
		}
	}
	if s.Classes, err = decodeList[resourceapi.DeviceClass]("classes", top["classes"]); err != nil {
		return nil, err
	}
	if s.Slices, err = decodeList[resourceapi.ResourceSlice]("slices", top["slices"]); err != nil {
		return nil, err
	}
	if s.Allocated, err = decodeList[resourceapi.ResourceClaim]("allocated", top["allocated"]); err != nil {
		return nil, err
	}
	if s.Claims, err = decodeList[resourceapi.ResourceClaim]("claims", top["claims"]); err != nil {
		return nil, err
	}
	for i, c := range s.Allocated {
		if c.Status.Allocation == nil {
			return nil, fmt.Errorf("allocated[%d] (claim %s/%s): status.allocation is missing; pre-existing claims must carry their allocation result (move the claim to 'claims' to allocate it)", i, c.Namespace, c.Name)
		}
	}
	for i, c := range s.Claims {
		if c.Status.Allocation != nil {
			return nil, fmt.Errorf("claims[%d] (claim %s/%s): status.allocation is already set; claims to allocate must be unallocated (move it to 'allocated')", i, c.Namespace, c.Name)
		}
	}
	return s, nil
}

// allocatedState builds the allocator's view of existing allocations exactly as
// kube-scheduler does (pkg/scheduler/framework/plugins/dynamicresources,
// foreachAllocatedDevice + GatherAllocatedState): admin-access results are ignored;
// with ConsumableCapacity, results with a shareID are shares whose consumedCapacity is
// aggregated per device; every other result is a dedicated device.
func newAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

func addAllocation(state *structured.AllocatedState, alloc *resourceapi.AllocationResult, consumableCapacity bool) {
	if alloc == nil {
		return
	}
	for _, result := range alloc.Devices.Results {
		if ptr.Deref(result.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(result.Driver, result.Pool, result.Device)
		if consumableCapacity && result.ShareID != nil {
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, result.ShareID))
			if result.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, result.ConsumedCapacity))
			}
			continue
		}
		state.AllocatedDevices.Insert(id)
	}
}

func cloneState(s structured.AllocatedState) structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         s.AllocatedDevices.Clone(),
		AllocatedSharedDeviceIDs: s.AllocatedSharedDeviceIDs.Clone(),
		AggregatedCapacity:       s.AggregatedCapacity.Clone(),
	}
}

func toNode(n nodeSpec) *v1.Node {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
	node.Status.DeclaredFeatures = n.DeclaredFeatures
	return node
}

// defaultNode is the node upstream's TestAllocator uses when a case names none.
var defaultNode = nodeSpec{Name: "node-1", Labels: map[string]string{"region": "region-1", "planet": "earth"}}

func runAllocate(ctx context.Context, s *scenario, features structured.Features, celCache *cel.Cache) allocateOutput {
	out := allocateOutput{Name: s.Name, Results: make([]*resourceapi.AllocationResult, len(s.Claims))}
	state := newAllocatedState()
	for _, c := range s.Allocated {
		addAllocation(&state, c.Status.Allocation, features.ConsumableCapacity)
	}
	allocator, err := structured.NewAllocator(ctx, features, state, classLister{s.Classes}, s.Slices, celCache)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	n := defaultNode
	if s.Node != nil {
		n = *s.Node
	}
	results, err := allocator.Allocate(ctx, toNode(n), s.Claims)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	if results != nil && len(results) != len(s.Claims) {
		out.Error = fmt.Sprintf("internal error: allocator returned %d results for %d claims", len(results), len(s.Claims))
		return out
	}
	for i := range results {
		out.Results[i] = &results[i]
	}
	return out
}

func runPlace(ctx context.Context, s *scenario, features structured.Features, celCache *cel.Cache) (placeOutput, error) {
	out := placeOutput{Name: s.Name, Results: make([]*resourceapi.AllocationResult, len(s.Claims)), Placements: make([]placement, 0, len(s.Claims))}
	if len(s.Nodes) == 0 {
		return out, errors.New("nodes: place mode needs at least one candidate node in 'nodes'")
	}
	nodes := make([]*v1.Node, len(s.Nodes))
	for i, n := range s.Nodes {
		nodes[i] = toNode(n)
	}
	state := newAllocatedState()
	for _, c := range s.Allocated {
		addAllocation(&state, c.Status.Allocation, features.ConsumableCapacity)
	}
	lister := classLister{s.Classes}
	start := time.Now()
	for i, claim := range s.Claims {
		p := placement{Claim: claim.Namespace + "/" + claim.Name}
		t0 := time.Now()
		// A fresh allocator per claim, like the scheduler's PreFilter per pod: the
		// allocated state is captured when the allocator is created.
		allocator, err := structured.NewAllocator(ctx, features, cloneState(state), lister, s.Slices, celCache)
		if err != nil {
			return out, fmt.Errorf("claims[%d] (%s): %w", i, p.Claim, err)
		}
		for _, node := range nodes {
			p.NodesTried++
			results, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				if errors.Is(err, structured.ErrFailedAllocationOnNode) {
					continue // per-node problem, as in the scheduler: try the next node
				}
				p.Error = err.Error()
				break
			}
			if len(results) == 1 {
				name := node.Name
				p.Node = &name
				p.Result = &results[0]
				addAllocation(&state, p.Result, features.ConsumableCapacity)
				out.Placed++
				break
			}
		}
		p.Seconds = time.Since(t0).Seconds()
		out.Results[i] = p.Result
		out.Placements = append(out.Placements, p)
	}
	out.TotalSeconds = time.Since(start).Seconds()
	return out, nil
}

func main() {
	mode := flag.String("mode", "allocate", "allocate: one Allocate call for 'node'; place: place claims one by one on 'nodes'")
	defaults := flag.Bool("defaults", true, "apply the API server's resource.k8s.io/v1 defaulting to claims and slices (allocationMode ExactCount, count 1, ...)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: allocator-harness [-mode allocate|place] [-defaults=false] [SCENARIO.yaml|-]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 1 {
		flag.Usage()
		os.Exit(2)
	}
	var data []byte
	var err error
	if flag.NArg() == 0 || flag.Arg(0) == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "allocator-harness: reading scenario: %v\n", err)
		os.Exit(2)
	}
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "allocator-harness: invalid scenario: %v\n", err)
		os.Exit(2)
	}
	s, err := parseScenario(data)
	if err != nil {
		fail(err)
	}
	if *defaults {
		applyDefaults(s)
	}
	features, err := parseFeatures(s.Features)
	if err != nil {
		fail(err)
	}
	celCache := cel.NewCache(100, cel.Features{
		EnableConsumableCapacity: features.ConsumableCapacity,
		EnableListTypeAttributes: features.ListTypeAttributes,
	})
	ctx := context.Background()
	var out any
	switch *mode {
	case "allocate":
		out = runAllocate(ctx, s, features, celCache)
	case "place":
		p, err := runPlace(ctx, s, features, celCache)
		if err != nil {
			fail(err)
		}
		out = p
	default:
		fmt.Fprintf(os.Stderr, "allocator-harness: -mode must be allocate or place, not %q\n", *mode)
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "allocator-harness: writing output: %v\n", err)
		os.Exit(1)
	}
}

/* region_layout - print the region layout of tessera_region.h as "name value" lines. */
#include <stdio.h>

#include "tessera_region.h"

#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))

int main(void)
{
    P("magic", TESSERA_REGION_MAGIC);
    P("version", TESSERA_REGION_VERSION);
    P("max_gpus", TESSERA_REGION_MAX_GPUS);
    P("max_slots", TESSERA_REGION_MAX_SLOTS);
    P("uuid_len", TESSERA_REGION_UUID_LEN);
    P("header_size", sizeof(tessera_region_header));
    P("gpu_size", sizeof(tessera_region_gpu));
    P("slot_size", sizeof(tessera_region_slot));
    P("file_size", TESSERA_REGION_FILE_SIZE);
    P("lock_byte", TESSERA_REGION_LOCK_BYTE);
    P("h.magic", offsetof(tessera_region_header, magic));
    P("h.version", offsetof(tessera_region_header, version));
    P("h.header_size", offsetof(tessera_region_header, header_size));
    P("h.slot_size", offsetof(tessera_region_header, slot_size));
    P("h.slot_count", offsetof(tessera_region_header, slot_count));
    P("h.gpu_count", offsetof(tessera_region_header, gpu_count));
    P("h.slot_high_water", offsetof(tessera_region_header, slot_high_water));
    P("h.generation", offsetof(tessera_region_header, generation));
    P("h.context_overhead", offsetof(tessera_region_header, context_overhead));
    P("h.gpus", offsetof(tessera_region_header, gpus));
    P("g.uuid", offsetof(tessera_region_gpu, uuid));
    P("g.memory_limit", offsetof(tessera_region_gpu, memory_limit));
    P("g.cores", offsetof(tessera_region_gpu, cores));
    P("g.flags", offsetof(tessera_region_gpu, flags));
    P("g.pace_tat_ns", offsetof(tessera_region_gpu, pace_tat_ns));
    P("g.launches", offsetof(tessera_region_gpu, launches));
    P("g.paced_ns", offsetof(tessera_region_gpu, paced_ns));
    P("s.state", offsetof(tessera_region_slot, state));
    P("s.pid", offsetof(tessera_region_slot, pid));
    P("s.pid_ns", offsetof(tessera_region_slot, pid_ns));
    P("s.start_time", offsetof(tessera_region_slot, start_time));
    P("s.generation", offsetof(tessera_region_slot, generation));
    P("s.used", offsetof(tessera_region_slot, used));
    P("s.contexts", offsetof(tessera_region_slot, contexts));
    return 0;
}

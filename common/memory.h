#pragma once
// Process-wide allocator settings for the data path.
//
// libzmq receives every large message into a fresh malloc() block. With
// glibc's defaults such blocks are mapped and unmapped (or the heap top is
// trimmed and regrown) every few messages, and every page of them faults
// again: on a VM that costs more than the copy of the data. Keeping large
// blocks in the heap and the heap untrimmed makes the freed blocks come
// back warm. This is the receive-side buffer pooling the design asks for,
// done where libzmq allocates (it has no hook to receive into our pool).
//
// KeepLargeAllocationsMapped() sets M_MMAP_THRESHOLD to 64 MiB and
// M_TRIM_THRESHOLD to 1 GiB for the whole process, once; later calls do
// nothing. It trades up to about 1 GiB of idle heap kept by the process for
// the page faults. Returns whether glibc accepted the settings.
namespace tessera {

bool KeepLargeAllocationsMapped();

}  // namespace tessera

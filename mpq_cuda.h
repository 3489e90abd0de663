/* mpq_cuda.h - the CUDA backend of mpq.

   Fills the mpq_backend dispatch table of mpq.h for one CUDA device:

       mpq_backend gpu;
       if (mpq_cuda_backend(0, &gpu) != MPQ_OK) mpq_backend_cpu(&gpu);  // fall back

   STATUS (v0.1): the table is complete in shape: device selection, one
   stream, upload of a packed bit-plane buffer to device memory and its
   release, synchronisation, and every CUDA error mapped to an mpq_status.
   The GEMV kernels are not in yet: gemv returns MPQ_ERR_UNSUPPORTED and
   caps is 0, so callers that check caps (as the demo does) fall back to the
   CPU backend. A machine without a GPU gets MPQ_ERR_NODEVICE, never a
   crash. Link with the program's MPQ_IMPLEMENTATION translation unit. */
#ifndef MPQ_CUDA_H_INCLUDED
#define MPQ_CUDA_H_INCLUDED

#include "mpq.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *b for CUDA device `device` (0-based). MPQ_ERR_NODEVICE when there
   is no such device or no driver; MPQ_ERR_DEVICE for other CUDA errors.
   On success release it with mpq_cuda_backend_destroy. */
mpq_status mpq_cuda_backend(int device, mpq_backend *b);
void mpq_cuda_backend_destroy(mpq_backend *b);

/* Number of CUDA devices, 0 when there is no driver or no GPU. */
int mpq_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif

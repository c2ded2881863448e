/* tandem-prefill: the prefill worker. */
#include "prefill.h"
#include "worker.h"

int main(int argc, char **argv)
{
    return worker_main(argc, argv, "tandem-prefill", &prefill_role, NULL);
}

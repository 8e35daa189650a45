// Every collective and the process grid on 4 ranks (see comm_cases.h).
#include "comm_cases.h"

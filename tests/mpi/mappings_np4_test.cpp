// Adjoint pairs and tensor-parallel layers on 4 ranks (see mappings_cases.h).
#include "mappings_cases.h"

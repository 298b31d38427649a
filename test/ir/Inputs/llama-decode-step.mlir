// The tiny Llama fixture's decode step (2 layers, KV capacity 16) as traced by
// poot.models: input of pipeline-llama-step.mlir. Regenerate by tracing
// StepSpec.decode(kv_capacity=16) of test/fixtures/tiny/llama and printing the graph.
module {
  func.func @llama_decode(%arg0: tensor<1x1xi32> {poot.name = "tokens"}, %arg1: tensor<1x1xi32> {poot.name = "positions"}, %arg2: tensor<1xi32> {poot.name = "slots"}, %arg3: tensor<1x16x2x16xf32> {poot.name = "kv.0.k"}, %arg4: tensor<1x16x2x16xf32> {poot.name = "kv.0.v"}, %arg5: tensor<1x16x2x16xf32> {poot.name = "kv.1.k"}, %arg6: tensor<1x16x2x16xf32> {poot.name = "kv.1.v"}) -> (tensor<1x1x256xf32> {poot.name = "logits"}, tensor<1x16x2x16xf32> {poot.name = "kv.0.k"}, tensor<1x16x2x16xf32> {poot.name = "kv.0.v"}, tensor<1x16x2x16xf32> {poot.name = "kv.1.k"}, tensor<1x16x2x16xf32> {poot.name = "kv.1.v"}) {
    %0 = "poot.broadcast"(%arg2) {dims = array<i64: 0>} : (tensor<1xi32>) -> tensor<1x1xi32>
    %1 = "poot.concat"(%0, %arg1) {axis = 1 : i64} : (tensor<1x1xi32>, tensor<1x1xi32>) -> tensor<1x2xi32>
    %2 = "poot.param"() {name = "tok_embed"} : () -> tensor<256x64xf32>
    %3 = "poot.gather"(%2, %arg0) {axis = 0 : i64} : (tensor<256x64xf32>, tensor<1x1xi32>) -> tensor<1x1x64xf32>
    %4 = "poot.cast"(%arg1) : (tensor<1x1xi32>) -> tensor<1x1xf32>
    %5 = "poot.reshape"(%4) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %6 = "poot.constant"() {value = dense<[1.000000e+00, 0.316227764, 1.000000e-01, 0.0316227786, 0.00999999977, 0.00316227786, 1.000000e-03, 3.16227786E-4]> : tensor<8xf32>} : () -> tensor<8xf32>
    %7 = "poot.broadcast"(%5) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x8xf32>
    %8 = "poot.broadcast"(%6) {dims = array<i64: 2>} : (tensor<8xf32>) -> tensor<1x1x8xf32>
    %9 = "poot.binary"(%7, %8) {fn = "mul"} : (tensor<1x1x8xf32>, tensor<1x1x8xf32>) -> tensor<1x1x8xf32>
    %10 = "poot.unary"(%9) {fn = "cos"} : (tensor<1x1x8xf32>) -> tensor<1x1x8xf32>
    %11 = "poot.unary"(%9) {fn = "sin"} : (tensor<1x1x8xf32>) -> tensor<1x1x8xf32>
    %12 = "poot.param"() {name = "blk.0.attn_norm"} : () -> tensor<64xf32>
    %13 = "poot.binary"(%3, %3) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %14 = "poot.reduce"(%13) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x64xf32>) -> tensor<1x1xf32>
    %15 = "poot.reshape"(%14) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %16 = "poot.constant"() {value = dense<6.400000e+01> : tensor<f32>} : () -> tensor<f32>
    %17 = "poot.broadcast"(%16) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %18 = "poot.binary"(%15, %17) {fn = "div"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %19 = "poot.constant"() {value = dense<9.99999997E-7> : tensor<f32>} : () -> tensor<f32>
    %20 = "poot.broadcast"(%19) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %21 = "poot.binary"(%18, %20) {fn = "add"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %22 = "poot.unary"(%21) {fn = "rsqrt"} : (tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %23 = "poot.broadcast"(%22) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x64xf32>
    %24 = "poot.binary"(%3, %23) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %25 = "poot.broadcast"(%12) {dims = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %26 = "poot.binary"(%24, %25) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %27 = "poot.param"() {name = "blk.0.attn.q"} : () -> tensor<64x64xf32>
    %28 = "poot.reshape"(%26) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %29 = "poot.transpose"(%27) {perm = array<i64: 1, 0>} : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %30 = "poot.matmul"(%28, %29) {acc = f32} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    %31 = "poot.reshape"(%30) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %32 = "poot.param"() {name = "blk.0.attn.k"} : () -> tensor<32x64xf32>
    %33 = "poot.reshape"(%26) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %34 = "poot.transpose"(%32) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
    %35 = "poot.matmul"(%33, %34) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
    %36 = "poot.reshape"(%35) : (tensor<1x32xf32>) -> tensor<1x1x32xf32>
    %37 = "poot.param"() {name = "blk.0.attn.v"} : () -> tensor<32x64xf32>
    %38 = "poot.reshape"(%26) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %39 = "poot.transpose"(%37) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
    %40 = "poot.matmul"(%38, %39) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
    %41 = "poot.reshape"(%40) : (tensor<1x32xf32>) -> tensor<1x1x32xf32>
    %42 = "poot.reshape"(%31) : (tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32>
    %43 = "poot.reshape"(%36) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %44 = "poot.reshape"(%41) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %45 = "poot.reshape"(%10) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %46 = "poot.reshape"(%11) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %47 = "poot.slice"(%42) {limit = array<i64: 1, 1, 4, 8>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x4x16xf32>) -> tensor<1x1x4x8xf32>
    %48 = "poot.slice"(%42) {limit = array<i64: 1, 1, 4, 16>, start = array<i64: 0, 0, 0, 8>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x4x16xf32>) -> tensor<1x1x4x8xf32>
    %49 = "poot.broadcast"(%45) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %50 = "poot.binary"(%47, %49) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %51 = "poot.broadcast"(%46) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %52 = "poot.binary"(%48, %51) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %53 = "poot.binary"(%50, %52) {fn = "sub"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %54 = "poot.broadcast"(%45) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %55 = "poot.binary"(%48, %54) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %56 = "poot.broadcast"(%46) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %57 = "poot.binary"(%47, %56) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %58 = "poot.binary"(%55, %57) {fn = "add"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %59 = "poot.concat"(%53, %58) {axis = 3 : i64} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x16xf32>
    %60 = "poot.reshape"(%10) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %61 = "poot.reshape"(%11) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %62 = "poot.slice"(%43) {limit = array<i64: 1, 1, 2, 8>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x2x16xf32>) -> tensor<1x1x2x8xf32>
    %63 = "poot.slice"(%43) {limit = array<i64: 1, 1, 2, 16>, start = array<i64: 0, 0, 0, 8>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x2x16xf32>) -> tensor<1x1x2x8xf32>
    %64 = "poot.broadcast"(%60) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %65 = "poot.binary"(%62, %64) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %66 = "poot.broadcast"(%61) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %67 = "poot.binary"(%63, %66) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %68 = "poot.binary"(%65, %67) {fn = "sub"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %69 = "poot.broadcast"(%60) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %70 = "poot.binary"(%63, %69) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %71 = "poot.broadcast"(%61) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %72 = "poot.binary"(%62, %71) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %73 = "poot.binary"(%70, %72) {fn = "add"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %74 = "poot.concat"(%68, %73) {axis = 3 : i64} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x16xf32>
    %75 = "poot.reshape"(%74) : (tensor<1x1x2x16xf32>) -> tensor<1x2x16xf32>
    %76 = "poot.scatter"(%arg3, %1, %75) : (tensor<1x16x2x16xf32>, tensor<1x2xi32>, tensor<1x2x16xf32>) -> tensor<1x16x2x16xf32>
    %77 = "poot.gather"(%76, %arg2) {axis = 0 : i64} : (tensor<1x16x2x16xf32>, tensor<1xi32>) -> tensor<1x16x2x16xf32>
    %78 = "poot.reshape"(%44) : (tensor<1x1x2x16xf32>) -> tensor<1x2x16xf32>
    %79 = "poot.scatter"(%arg4, %1, %78) : (tensor<1x16x2x16xf32>, tensor<1x2xi32>, tensor<1x2x16xf32>) -> tensor<1x16x2x16xf32>
    %80 = "poot.gather"(%79, %arg2) {axis = 0 : i64} : (tensor<1x16x2x16xf32>, tensor<1xi32>) -> tensor<1x16x2x16xf32>
    %81 = "poot.reshape"(%59) : (tensor<1x1x4x16xf32>) -> tensor<1x1x2x2x16xf32>
    %82 = "poot.transpose"(%81) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %83 = "poot.reshape"(%82) : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x16xf32>
    %84 = "poot.transpose"(%77) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x16x2x16xf32>) -> tensor<1x2x16x16xf32>
    %85 = "poot.matmul"(%83, %84) {acc = f32} : (tensor<1x2x2x16xf32>, tensor<1x2x16x16xf32>) -> tensor<1x2x2x16xf32>
    %86 = "poot.constant"() {value = dense<2.500000e-01> : tensor<f32>} : () -> tensor<f32>
    %87 = "poot.broadcast"(%86) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x16xf32>
    %88 = "poot.binary"(%85, %87) {fn = "mul"} : (tensor<1x2x2x16xf32>, tensor<1x2x2x16xf32>) -> tensor<1x2x2x16xf32>
    %89 = "poot.reshape"(%88) : (tensor<1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %90 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x16xi32>
    %91 = "poot.reshape"(%arg1) : (tensor<1x1xi32>) -> tensor<1x1x1xi32>
    %92 = "poot.reshape"(%90) : (tensor<1x16xi32>) -> tensor<1x1x16xi32>
    %93 = "poot.broadcast"(%91) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xi32>) -> tensor<1x1x16xi32>
    %94 = "poot.compare"(%92, %93) {pred = "le"} : (tensor<1x1x16xi32>, tensor<1x1x16xi32>) -> tensor<1x1x16xi1>
    %95 = "poot.reshape"(%94) : (tensor<1x1x16xi1>) -> tensor<1x1x1x1x16xi1>
    %96 = "poot.broadcast"(%95) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x1x16xi1>) -> tensor<1x2x2x1x16xi1>
    %97 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
    %98 = "poot.broadcast"(%97) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x16xf32>
    %99 = "poot.select"(%96, %89, %98) : (tensor<1x2x2x1x16xi1>, tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %100 = "poot.reduce"(%99) {axes = array<i64: 4>, fn = "max"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1xf32>
    %101 = "poot.reshape"(%100) : (tensor<1x2x2x1xf32>) -> tensor<1x2x2x1x1xf32>
    %102 = "poot.broadcast"(%101) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x16xf32>
    %103 = "poot.binary"(%99, %102) {fn = "sub"} : (tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %104 = "poot.unary"(%103) {fn = "exp"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %105 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %106 = "poot.broadcast"(%105) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x16xf32>
    %107 = "poot.select"(%96, %104, %106) : (tensor<1x2x2x1x16xi1>, tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %108 = "poot.reduce"(%107) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1xf32>
    %109 = "poot.reshape"(%108) : (tensor<1x2x2x1xf32>) -> tensor<1x2x2x1x1xf32>
    %110 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %111 = "poot.broadcast"(%110) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x1xf32>
    %112 = "poot.binary"(%109, %111) {fn = "max"} : (tensor<1x2x2x1x1xf32>, tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x1xf32>
    %113 = "poot.broadcast"(%112) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x16xf32>
    %114 = "poot.binary"(%107, %113) {fn = "div"} : (tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %115 = "poot.reshape"(%114) : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x16xf32>
    %116 = "poot.transpose"(%80) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x16x2x16xf32>) -> tensor<1x2x16x16xf32>
    %117 = "poot.matmul"(%115, %116) {acc = f32} : (tensor<1x2x2x16xf32>, tensor<1x2x16x16xf32>) -> tensor<1x2x2x16xf32>
    %118 = "poot.reshape"(%117) : (tensor<1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %119 = "poot.transpose"(%118) {perm = array<i64: 0, 3, 1, 2, 4>} : (tensor<1x2x2x1x16xf32>) -> tensor<1x1x2x2x16xf32>
    %120 = "poot.reshape"(%119) : (tensor<1x1x2x2x16xf32>) -> tensor<1x1x4x16xf32>
    %121 = "poot.reshape"(%120) : (tensor<1x1x4x16xf32>) -> tensor<1x1x64xf32>
    %122 = "poot.param"() {name = "blk.0.attn.o"} : () -> tensor<64x64xf32>
    %123 = "poot.reshape"(%121) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %124 = "poot.transpose"(%122) {perm = array<i64: 1, 0>} : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %125 = "poot.matmul"(%123, %124) {acc = f32} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    %126 = "poot.reshape"(%125) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %127 = "poot.binary"(%3, %126) {fn = "add"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %128 = "poot.param"() {name = "blk.0.ffn_norm"} : () -> tensor<64xf32>
    %129 = "poot.binary"(%127, %127) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %130 = "poot.reduce"(%129) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x64xf32>) -> tensor<1x1xf32>
    %131 = "poot.reshape"(%130) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %132 = "poot.constant"() {value = dense<6.400000e+01> : tensor<f32>} : () -> tensor<f32>
    %133 = "poot.broadcast"(%132) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %134 = "poot.binary"(%131, %133) {fn = "div"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %135 = "poot.constant"() {value = dense<9.99999997E-7> : tensor<f32>} : () -> tensor<f32>
    %136 = "poot.broadcast"(%135) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %137 = "poot.binary"(%134, %136) {fn = "add"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %138 = "poot.unary"(%137) {fn = "rsqrt"} : (tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %139 = "poot.broadcast"(%138) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x64xf32>
    %140 = "poot.binary"(%127, %139) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %141 = "poot.broadcast"(%128) {dims = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %142 = "poot.binary"(%140, %141) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %143 = "poot.param"() {name = "blk.0.ffn.gate"} : () -> tensor<128x64xf32>
    %144 = "poot.param"() {name = "blk.0.ffn.up"} : () -> tensor<128x64xf32>
    %145 = "poot.param"() {name = "blk.0.ffn.down"} : () -> tensor<64x128xf32>
    %146 = "poot.reshape"(%142) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %147 = "poot.transpose"(%143) {perm = array<i64: 1, 0>} : (tensor<128x64xf32>) -> tensor<64x128xf32>
    %148 = "poot.matmul"(%146, %147) {acc = f32} : (tensor<1x64xf32>, tensor<64x128xf32>) -> tensor<1x128xf32>
    %149 = "poot.reshape"(%148) : (tensor<1x128xf32>) -> tensor<1x1x128xf32>
    %150 = "poot.unary"(%149) {fn = "neg"} : (tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %151 = "poot.unary"(%150) {fn = "exp"} : (tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %152 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %153 = "poot.broadcast"(%152) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x128xf32>
    %154 = "poot.binary"(%151, %153) {fn = "add"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %155 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %156 = "poot.broadcast"(%155) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x128xf32>
    %157 = "poot.binary"(%156, %154) {fn = "div"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %158 = "poot.binary"(%149, %157) {fn = "mul"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %159 = "poot.reshape"(%142) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %160 = "poot.transpose"(%144) {perm = array<i64: 1, 0>} : (tensor<128x64xf32>) -> tensor<64x128xf32>
    %161 = "poot.matmul"(%159, %160) {acc = f32} : (tensor<1x64xf32>, tensor<64x128xf32>) -> tensor<1x128xf32>
    %162 = "poot.reshape"(%161) : (tensor<1x128xf32>) -> tensor<1x1x128xf32>
    %163 = "poot.binary"(%158, %162) {fn = "mul"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %164 = "poot.reshape"(%163) : (tensor<1x1x128xf32>) -> tensor<1x128xf32>
    %165 = "poot.transpose"(%145) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %166 = "poot.matmul"(%164, %165) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    %167 = "poot.reshape"(%166) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %168 = "poot.binary"(%127, %167) {fn = "add"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %169 = "poot.param"() {name = "blk.1.attn_norm"} : () -> tensor<64xf32>
    %170 = "poot.binary"(%168, %168) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %171 = "poot.reduce"(%170) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x64xf32>) -> tensor<1x1xf32>
    %172 = "poot.reshape"(%171) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %173 = "poot.constant"() {value = dense<6.400000e+01> : tensor<f32>} : () -> tensor<f32>
    %174 = "poot.broadcast"(%173) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %175 = "poot.binary"(%172, %174) {fn = "div"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %176 = "poot.constant"() {value = dense<9.99999997E-7> : tensor<f32>} : () -> tensor<f32>
    %177 = "poot.broadcast"(%176) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %178 = "poot.binary"(%175, %177) {fn = "add"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %179 = "poot.unary"(%178) {fn = "rsqrt"} : (tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %180 = "poot.broadcast"(%179) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x64xf32>
    %181 = "poot.binary"(%168, %180) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %182 = "poot.broadcast"(%169) {dims = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %183 = "poot.binary"(%181, %182) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %184 = "poot.param"() {name = "blk.1.attn.q"} : () -> tensor<64x64xf32>
    %185 = "poot.reshape"(%183) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %186 = "poot.transpose"(%184) {perm = array<i64: 1, 0>} : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %187 = "poot.matmul"(%185, %186) {acc = f32} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    %188 = "poot.reshape"(%187) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %189 = "poot.param"() {name = "blk.1.attn.k"} : () -> tensor<32x64xf32>
    %190 = "poot.reshape"(%183) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %191 = "poot.transpose"(%189) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
    %192 = "poot.matmul"(%190, %191) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
    %193 = "poot.reshape"(%192) : (tensor<1x32xf32>) -> tensor<1x1x32xf32>
    %194 = "poot.param"() {name = "blk.1.attn.v"} : () -> tensor<32x64xf32>
    %195 = "poot.reshape"(%183) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %196 = "poot.transpose"(%194) {perm = array<i64: 1, 0>} : (tensor<32x64xf32>) -> tensor<64x32xf32>
    %197 = "poot.matmul"(%195, %196) {acc = f32} : (tensor<1x64xf32>, tensor<64x32xf32>) -> tensor<1x32xf32>
    %198 = "poot.reshape"(%197) : (tensor<1x32xf32>) -> tensor<1x1x32xf32>
    %199 = "poot.reshape"(%188) : (tensor<1x1x64xf32>) -> tensor<1x1x4x16xf32>
    %200 = "poot.reshape"(%193) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %201 = "poot.reshape"(%198) : (tensor<1x1x32xf32>) -> tensor<1x1x2x16xf32>
    %202 = "poot.reshape"(%10) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %203 = "poot.reshape"(%11) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %204 = "poot.slice"(%199) {limit = array<i64: 1, 1, 4, 8>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x4x16xf32>) -> tensor<1x1x4x8xf32>
    %205 = "poot.slice"(%199) {limit = array<i64: 1, 1, 4, 16>, start = array<i64: 0, 0, 0, 8>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x4x16xf32>) -> tensor<1x1x4x8xf32>
    %206 = "poot.broadcast"(%202) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %207 = "poot.binary"(%204, %206) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %208 = "poot.broadcast"(%203) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %209 = "poot.binary"(%205, %208) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %210 = "poot.binary"(%207, %209) {fn = "sub"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %211 = "poot.broadcast"(%202) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %212 = "poot.binary"(%205, %211) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %213 = "poot.broadcast"(%203) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x4x8xf32>
    %214 = "poot.binary"(%204, %213) {fn = "mul"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %215 = "poot.binary"(%212, %214) {fn = "add"} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x8xf32>
    %216 = "poot.concat"(%210, %215) {axis = 3 : i64} : (tensor<1x1x4x8xf32>, tensor<1x1x4x8xf32>) -> tensor<1x1x4x16xf32>
    %217 = "poot.reshape"(%10) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %218 = "poot.reshape"(%11) : (tensor<1x1x8xf32>) -> tensor<1x1x1x8xf32>
    %219 = "poot.slice"(%200) {limit = array<i64: 1, 1, 2, 8>, start = array<i64: 0, 0, 0, 0>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x2x16xf32>) -> tensor<1x1x2x8xf32>
    %220 = "poot.slice"(%200) {limit = array<i64: 1, 1, 2, 16>, start = array<i64: 0, 0, 0, 8>, stride = array<i64: 1, 1, 1, 1>} : (tensor<1x1x2x16xf32>) -> tensor<1x1x2x8xf32>
    %221 = "poot.broadcast"(%217) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %222 = "poot.binary"(%219, %221) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %223 = "poot.broadcast"(%218) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %224 = "poot.binary"(%220, %223) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %225 = "poot.binary"(%222, %224) {fn = "sub"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %226 = "poot.broadcast"(%217) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %227 = "poot.binary"(%220, %226) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %228 = "poot.broadcast"(%218) {dims = array<i64: 0, 1, 2, 3>} : (tensor<1x1x1x8xf32>) -> tensor<1x1x2x8xf32>
    %229 = "poot.binary"(%219, %228) {fn = "mul"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %230 = "poot.binary"(%227, %229) {fn = "add"} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x8xf32>
    %231 = "poot.concat"(%225, %230) {axis = 3 : i64} : (tensor<1x1x2x8xf32>, tensor<1x1x2x8xf32>) -> tensor<1x1x2x16xf32>
    %232 = "poot.reshape"(%231) : (tensor<1x1x2x16xf32>) -> tensor<1x2x16xf32>
    %233 = "poot.scatter"(%arg5, %1, %232) : (tensor<1x16x2x16xf32>, tensor<1x2xi32>, tensor<1x2x16xf32>) -> tensor<1x16x2x16xf32>
    %234 = "poot.gather"(%233, %arg2) {axis = 0 : i64} : (tensor<1x16x2x16xf32>, tensor<1xi32>) -> tensor<1x16x2x16xf32>
    %235 = "poot.reshape"(%201) : (tensor<1x1x2x16xf32>) -> tensor<1x2x16xf32>
    %236 = "poot.scatter"(%arg6, %1, %235) : (tensor<1x16x2x16xf32>, tensor<1x2xi32>, tensor<1x2x16xf32>) -> tensor<1x16x2x16xf32>
    %237 = "poot.gather"(%236, %arg2) {axis = 0 : i64} : (tensor<1x16x2x16xf32>, tensor<1xi32>) -> tensor<1x16x2x16xf32>
    %238 = "poot.reshape"(%216) : (tensor<1x1x4x16xf32>) -> tensor<1x1x2x2x16xf32>
    %239 = "poot.transpose"(%238) {perm = array<i64: 0, 2, 3, 1, 4>} : (tensor<1x1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %240 = "poot.reshape"(%239) : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x16xf32>
    %241 = "poot.transpose"(%234) {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x16x2x16xf32>) -> tensor<1x2x16x16xf32>
    %242 = "poot.matmul"(%240, %241) {acc = f32} : (tensor<1x2x2x16xf32>, tensor<1x2x16x16xf32>) -> tensor<1x2x2x16xf32>
    %243 = "poot.constant"() {value = dense<2.500000e-01> : tensor<f32>} : () -> tensor<f32>
    %244 = "poot.broadcast"(%243) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x16xf32>
    %245 = "poot.binary"(%242, %244) {fn = "mul"} : (tensor<1x2x2x16xf32>, tensor<1x2x2x16xf32>) -> tensor<1x2x2x16xf32>
    %246 = "poot.reshape"(%245) : (tensor<1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %247 = "poot.iota"() {axis = 1 : i64} : () -> tensor<1x16xi32>
    %248 = "poot.reshape"(%arg1) : (tensor<1x1xi32>) -> tensor<1x1x1xi32>
    %249 = "poot.reshape"(%247) : (tensor<1x16xi32>) -> tensor<1x1x16xi32>
    %250 = "poot.broadcast"(%248) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xi32>) -> tensor<1x1x16xi32>
    %251 = "poot.compare"(%249, %250) {pred = "le"} : (tensor<1x1x16xi32>, tensor<1x1x16xi32>) -> tensor<1x1x16xi1>
    %252 = "poot.reshape"(%251) : (tensor<1x1x16xi1>) -> tensor<1x1x1x1x16xi1>
    %253 = "poot.broadcast"(%252) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x1x1x1x16xi1>) -> tensor<1x2x2x1x16xi1>
    %254 = "poot.constant"() {value = dense<-1.000000e+30> : tensor<f32>} : () -> tensor<f32>
    %255 = "poot.broadcast"(%254) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x16xf32>
    %256 = "poot.select"(%253, %246, %255) : (tensor<1x2x2x1x16xi1>, tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %257 = "poot.reduce"(%256) {axes = array<i64: 4>, fn = "max"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1xf32>
    %258 = "poot.reshape"(%257) : (tensor<1x2x2x1xf32>) -> tensor<1x2x2x1x1xf32>
    %259 = "poot.broadcast"(%258) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x16xf32>
    %260 = "poot.binary"(%256, %259) {fn = "sub"} : (tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %261 = "poot.unary"(%260) {fn = "exp"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %262 = "poot.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %263 = "poot.broadcast"(%262) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x16xf32>
    %264 = "poot.select"(%253, %261, %263) : (tensor<1x2x2x1x16xi1>, tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %265 = "poot.reduce"(%264) {axes = array<i64: 4>, fn = "sum"} : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1xf32>
    %266 = "poot.reshape"(%265) : (tensor<1x2x2x1xf32>) -> tensor<1x2x2x1x1xf32>
    %267 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %268 = "poot.broadcast"(%267) {dims = array<i64>} : (tensor<f32>) -> tensor<1x2x2x1x1xf32>
    %269 = "poot.binary"(%266, %268) {fn = "max"} : (tensor<1x2x2x1x1xf32>, tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x1xf32>
    %270 = "poot.broadcast"(%269) {dims = array<i64: 0, 1, 2, 3, 4>} : (tensor<1x2x2x1x1xf32>) -> tensor<1x2x2x1x16xf32>
    %271 = "poot.binary"(%264, %270) {fn = "div"} : (tensor<1x2x2x1x16xf32>, tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x1x16xf32>
    %272 = "poot.reshape"(%271) : (tensor<1x2x2x1x16xf32>) -> tensor<1x2x2x16xf32>
    %273 = "poot.transpose"(%237) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x16x2x16xf32>) -> tensor<1x2x16x16xf32>
    %274 = "poot.matmul"(%272, %273) {acc = f32} : (tensor<1x2x2x16xf32>, tensor<1x2x16x16xf32>) -> tensor<1x2x2x16xf32>
    %275 = "poot.reshape"(%274) : (tensor<1x2x2x16xf32>) -> tensor<1x2x2x1x16xf32>
    %276 = "poot.transpose"(%275) {perm = array<i64: 0, 3, 1, 2, 4>} : (tensor<1x2x2x1x16xf32>) -> tensor<1x1x2x2x16xf32>
    %277 = "poot.reshape"(%276) : (tensor<1x1x2x2x16xf32>) -> tensor<1x1x4x16xf32>
    %278 = "poot.reshape"(%277) : (tensor<1x1x4x16xf32>) -> tensor<1x1x64xf32>
    %279 = "poot.param"() {name = "blk.1.attn.o"} : () -> tensor<64x64xf32>
    %280 = "poot.reshape"(%278) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %281 = "poot.transpose"(%279) {perm = array<i64: 1, 0>} : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %282 = "poot.matmul"(%280, %281) {acc = f32} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    %283 = "poot.reshape"(%282) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %284 = "poot.binary"(%168, %283) {fn = "add"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %285 = "poot.param"() {name = "blk.1.ffn_norm"} : () -> tensor<64xf32>
    %286 = "poot.binary"(%284, %284) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %287 = "poot.reduce"(%286) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x64xf32>) -> tensor<1x1xf32>
    %288 = "poot.reshape"(%287) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %289 = "poot.constant"() {value = dense<6.400000e+01> : tensor<f32>} : () -> tensor<f32>
    %290 = "poot.broadcast"(%289) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %291 = "poot.binary"(%288, %290) {fn = "div"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %292 = "poot.constant"() {value = dense<9.99999997E-7> : tensor<f32>} : () -> tensor<f32>
    %293 = "poot.broadcast"(%292) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %294 = "poot.binary"(%291, %293) {fn = "add"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %295 = "poot.unary"(%294) {fn = "rsqrt"} : (tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %296 = "poot.broadcast"(%295) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x64xf32>
    %297 = "poot.binary"(%284, %296) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %298 = "poot.broadcast"(%285) {dims = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %299 = "poot.binary"(%297, %298) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %300 = "poot.param"() {name = "blk.1.ffn.gate"} : () -> tensor<128x64xf32>
    %301 = "poot.param"() {name = "blk.1.ffn.up"} : () -> tensor<128x64xf32>
    %302 = "poot.param"() {name = "blk.1.ffn.down"} : () -> tensor<64x128xf32>
    %303 = "poot.reshape"(%299) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %304 = "poot.transpose"(%300) {perm = array<i64: 1, 0>} : (tensor<128x64xf32>) -> tensor<64x128xf32>
    %305 = "poot.matmul"(%303, %304) {acc = f32} : (tensor<1x64xf32>, tensor<64x128xf32>) -> tensor<1x128xf32>
    %306 = "poot.reshape"(%305) : (tensor<1x128xf32>) -> tensor<1x1x128xf32>
    %307 = "poot.unary"(%306) {fn = "neg"} : (tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %308 = "poot.unary"(%307) {fn = "exp"} : (tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %309 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %310 = "poot.broadcast"(%309) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x128xf32>
    %311 = "poot.binary"(%308, %310) {fn = "add"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %312 = "poot.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %313 = "poot.broadcast"(%312) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x128xf32>
    %314 = "poot.binary"(%313, %311) {fn = "div"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %315 = "poot.binary"(%306, %314) {fn = "mul"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %316 = "poot.reshape"(%299) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %317 = "poot.transpose"(%301) {perm = array<i64: 1, 0>} : (tensor<128x64xf32>) -> tensor<64x128xf32>
    %318 = "poot.matmul"(%316, %317) {acc = f32} : (tensor<1x64xf32>, tensor<64x128xf32>) -> tensor<1x128xf32>
    %319 = "poot.reshape"(%318) : (tensor<1x128xf32>) -> tensor<1x1x128xf32>
    %320 = "poot.binary"(%315, %319) {fn = "mul"} : (tensor<1x1x128xf32>, tensor<1x1x128xf32>) -> tensor<1x1x128xf32>
    %321 = "poot.reshape"(%320) : (tensor<1x1x128xf32>) -> tensor<1x128xf32>
    %322 = "poot.transpose"(%302) {perm = array<i64: 1, 0>} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %323 = "poot.matmul"(%321, %322) {acc = f32} : (tensor<1x128xf32>, tensor<128x64xf32>) -> tensor<1x64xf32>
    %324 = "poot.reshape"(%323) : (tensor<1x64xf32>) -> tensor<1x1x64xf32>
    %325 = "poot.binary"(%284, %324) {fn = "add"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %326 = "poot.param"() {name = "out_norm"} : () -> tensor<64xf32>
    %327 = "poot.binary"(%325, %325) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %328 = "poot.reduce"(%327) {axes = array<i64: 2>, fn = "sum"} : (tensor<1x1x64xf32>) -> tensor<1x1xf32>
    %329 = "poot.reshape"(%328) : (tensor<1x1xf32>) -> tensor<1x1x1xf32>
    %330 = "poot.constant"() {value = dense<6.400000e+01> : tensor<f32>} : () -> tensor<f32>
    %331 = "poot.broadcast"(%330) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %332 = "poot.binary"(%329, %331) {fn = "div"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %333 = "poot.constant"() {value = dense<9.99999997E-7> : tensor<f32>} : () -> tensor<f32>
    %334 = "poot.broadcast"(%333) {dims = array<i64>} : (tensor<f32>) -> tensor<1x1x1xf32>
    %335 = "poot.binary"(%332, %334) {fn = "add"} : (tensor<1x1x1xf32>, tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %336 = "poot.unary"(%335) {fn = "rsqrt"} : (tensor<1x1x1xf32>) -> tensor<1x1x1xf32>
    %337 = "poot.broadcast"(%336) {dims = array<i64: 0, 1, 2>} : (tensor<1x1x1xf32>) -> tensor<1x1x64xf32>
    %338 = "poot.binary"(%325, %337) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %339 = "poot.broadcast"(%326) {dims = array<i64: 2>} : (tensor<64xf32>) -> tensor<1x1x64xf32>
    %340 = "poot.binary"(%338, %339) {fn = "mul"} : (tensor<1x1x64xf32>, tensor<1x1x64xf32>) -> tensor<1x1x64xf32>
    %341 = "poot.param"() {name = "lm_head"} : () -> tensor<256x64xf32>
    %342 = "poot.reshape"(%340) : (tensor<1x1x64xf32>) -> tensor<1x64xf32>
    %343 = "poot.transpose"(%341) {perm = array<i64: 1, 0>} : (tensor<256x64xf32>) -> tensor<64x256xf32>
    %344 = "poot.matmul"(%342, %343) {acc = f32} : (tensor<1x64xf32>, tensor<64x256xf32>) -> tensor<1x256xf32>
    %345 = "poot.reshape"(%344) : (tensor<1x256xf32>) -> tensor<1x1x256xf32>
    return %345, %76, %79, %233, %236 : tensor<1x1x256xf32>, tensor<1x16x2x16xf32>, tensor<1x16x2x16xf32>, tensor<1x16x2x16xf32>, tensor<1x16x2x16xf32>
  }
}

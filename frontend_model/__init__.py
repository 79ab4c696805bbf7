from frontend_model.compile_policy import apply_compile_policy

apply_compile_policy()

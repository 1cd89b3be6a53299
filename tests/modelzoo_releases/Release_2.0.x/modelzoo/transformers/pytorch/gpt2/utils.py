def set_defaults(params):
    for section in ("train_input", "eval_input"):
        if section in params:
            params[section].setdefault("shuffle_seed", 1)
    return params

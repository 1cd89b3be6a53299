import argparse

import yaml


def get_params_from_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("target_device", choices=["CPU", "CSX"])
    parser.add_argument("--mode", default="train")
    parser.add_argument("--params", required=True)
    parser.add_argument("--model_dir", default="./model_dir")
    args = parser.parse_args()
    with open(args.params) as f:
        params = yaml.safe_load(f)
    params["runconfig"].update(target_device=args.target_device, model_dir=args.model_dir)
    return params
